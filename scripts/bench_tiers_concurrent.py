#!/usr/bin/env python3
"""KV tiers under concurrent workflows: `choreo run workflows/madpar.yaml --inputs` on the first C MATH-500
problems at --concurrency C, with T0 below the working set, per eviction policy and lower tier. Every
configuration must give the all-fit run's texts and tokens for every message (the script checks, from
--json); only time, memory and tier traffic differ.

usage: scripts/bench_tiers_concurrent.py [-m MODEL] [-c 8,16,32] [--t0-fraction 0.6] [-r 1] [--configs a,b,...]

Configurations (T0 = --t0-fraction of the all-fit run's peak T0):
  all-fit       --cache-mib 8192: nothing is evicted
  lru-recomp    LRU, evicted messages are recomputed
  wf-recomp     workflow (KVFlow) eviction, no lower tier
  lru-reload    LRU, T1 as large as the all-fit peak (reactive reload)
  wf-reload-pf  workflow eviction, T1 as large as the all-fit peak, prefetch 2 steps ahead
Each run is timed end to end and its peak RSS read from /usr/bin/time -v. "moved MiB" is every byte copied
between tiers (T0->T1 offloads, T1->T0 loads, T2 writes and loads). "hit rate" is the share of evicted
messages read again that came back from a tier rather than being recomputed.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from bench_lock import machine_turn
from choreo_cache import DEFAULT_MODEL

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("CHOREO_SHARED", os.path.join(ROOT, "..", "shared"))


def run(args, rows, concurrency, extra):
    with tempfile.NamedTemporaryFile(suffix=".json") as js, tempfile.NamedTemporaryFile(suffix=".txt") as tv:
        cmd = ["/usr/bin/time", "-v", "-o", tv.name, args.choreo, "run", os.path.join(ROOT, "workflows", "madpar.yaml"),
               "-m", args.model, "--inputs", rows, "--concurrency", str(concurrency), "--no-store", "-t",
               str(args.threads), "--json", js.name] + extra
        with machine_turn():
            t0 = time.monotonic()
            p = subprocess.run(cmd, capture_output=True, text=True)
            wall = time.monotonic() - t0
        if p.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
        doc = json.load(open(js.name))
        rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(tv.name).read()).group(1))
    messages = [[(m["name"], m["text"], m["tokens"]) for m in inst["messages"]] for inst in doc["instances"]]
    return wall, rss_kb / 1024, doc["tiers"], messages


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=DEFAULT_MODEL)
    ap.add_argument("-c", "--concurrency", default="8,16,32")
    ap.add_argument("--t0-fraction", type=float, default=0.6)
    ap.add_argument("-r", "--repeat", type=int, default=1)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--configs", default="")
    ap.add_argument("--choreo", default=os.path.join(ROOT, "build", "choreo"))
    args = ap.parse_args()

    problems = [json.loads(line) for line in open(os.path.join(SHARED, "data", "math500_test.jsonl"))]
    for c in [int(x) for x in args.concurrency.split(",")]:
        tmp = tempfile.mkdtemp()
        rows = os.path.join(tmp, "rows.jsonl")
        with open(rows, "w") as f:
            for p in problems[:c]:
                f.write(json.dumps({"problem": p["problem"]}) + "\n")
        _, _, tiers, ref = run(args, rows, c, ["--cache-mib", "8192"])
        peak = tiers["t0_peak_bytes"] / 2**20
        t0 = int(peak * args.t0_fraction)
        t1 = int(peak) + 64
        configs = {
            "all-fit": ["--cache-mib", "8192"],
            "lru-recomp": ["--cache-mib", str(t0), "--evict", "lru"],
            "wf-recomp": ["--cache-mib", str(t0), "--evict", "workflow", "--prefetch-steps", "0"],
            "lru-reload": ["--cache-mib", str(t0), "--evict", "lru", "--host-cache-mib", str(t1)],
            "wf-reload-pf": ["--cache-mib", str(t0), "--evict", "workflow", "--host-cache-mib", str(t1),
                             "--prefetch-steps", "2"],
        }
        if args.configs:
            configs = {k: v for k, v in configs.items() if k in args.configs.split(",")}
        print(f"\n### --concurrency {c}: {c} problems; all-fit peak T0 {peak:.0f} MiB; T0 {t0} MiB, T1 {t1} MiB",
              flush=True)
        walls = {k: [] for k in configs}
        last = {}
        for r in range(args.repeat):
            for k in (list(configs) if r % 2 == 0 else list(reversed(configs))):
                wall, rss, t, msgs = run(args, rows, c, configs[k])
                if msgs != ref:
                    sys.exit(f"c={c} {k}: messages differ from the all-fit run: tiers changed a result")
                walls[k].append(wall)
                last[k] = (rss, t)
                # On stdout: the raw figures behind the means, ranges and per-round ratios (BENCHMARKS.md).
                print(f"  round {r + 1} {k}: {wall:.1f} s, peak RSS {rss:.0f} MiB", flush=True)
        print("| configuration | end-to-end s (mean, range) | peak RSS MiB | T0 evictions | T1 loads | recomputes "
              "(tokens) | hit rate | prefetches (used) | moved MiB | peak T0 / T1 MiB | messages |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for k in configs:
            rss, t = last[k]
            loads = t["t1_hits"] + t["t2_hits"]
            reads = loads + t["recomputes"]
            moved = (t["t1_offload_bytes"] + t["t1_load_bytes"] + t["t2_write_bytes"] + t["t2_load_bytes"]) / 2**20
            w = walls[k]
            print(f"| {k} | {statistics.mean(w):.1f} ({min(w):.1f}-{max(w):.1f}) | {rss:.0f} | {t['t0_evictions']} | "
                  f"{loads} | {t['recomputes']} ({t['recomputed_tokens']}) | "
                  f"{(loads / reads if reads else 1.0):.0%} | {t.get('prefetches', 0)} ({t.get('prefetch_used', 0)}) | "
                  f"{moved:.0f} | {t['t0_peak_bytes'] / 2**20:.0f} / {t['t1_peak_bytes'] / 2**20:.0f} | same |",
                  flush=True)


if __name__ == "__main__":
    main()
