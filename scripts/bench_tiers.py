#!/usr/bin/env python3
"""KV tiers on KVFlow's sequential workflow (benchmarks/workflows/kvflow.yaml): agents with fixed ~2048-token
prompts run round-robin while T0 holds only some of the prompts. Every configuration runs the same workflow on
the same documents; the outputs must be identical (the script checks), only the time differs.

usage: scripts/bench_tiers.py [-m MODEL] [--agents 10] [--rounds 5] [--hold 4] [-r 3] [-t 2] [--cold]
                              [--configs a,b,...] [--busy] [--versus OLD_CHOREO]

Configurations (T0 = --hold agents' prompts plus room for one turn):
  all-fit       T0 holds everything: nothing is evicted (the floor)
  lru-recomp    LRU, no T1: an evicted prompt is recomputed (llama.cpp / vLLM without offload)
  lru-reload    LRU, T1 holds every prompt: evicted prompts are copied back (HiCache-style reactive reload)
  wf-recomp     workflow (KVFlow) eviction, no T1, no prefetch
  wf-reload     workflow eviction, T1 holds every prompt, no prefetch
  wf-reload-pf  workflow eviction, T1 holds every prompt, prefetch 2 steps ahead with status-aware scheduling
  lru-disk      LRU, no T1, T2 (the persistent store, a fresh directory per run) holds every prompt
  wf-disk       workflow eviction, no T1, T2 holds every prompt, no prefetch
  wf-disk-pf    workflow eviction, no T1, T2 holds every prompt, prefetch 2 steps ahead
T2 reads go through the page cache (entries are mmapped) unless --cold, which drops each entry from the page
cache when it is opened ($CHOREO_STORE_COLD_READS=1), so T2 loads read the disk. lru-disk-warm, wf-disk-warm
and wf-disk-pf-warm are the T2 configurations read through the page cache even with --cold. --busy runs a CPU-bound
neighbour process (one busy thread) beside every run. The configurations take turns within each of the r
rounds, and each run's times are printed as it ends ("round R CONFIG: ..."), so the output holds the raw figures
of every summary. Each figure is the mean over the rounds with the per-round range; "vs lru-recomp" is the ratio
of the means, with the range of each round's ratio (against lru-recomp's run of the same round); "turns s" is
the time of every call but the first prefill of the prompts (what the tiers decide).
Peak RSS is the largest over the rounds, from /usr/bin/time -v. With $CHOREO_CPU_LOCK set, each run holds that
lock file (scripts/bench_lock.py), so builds taking the same lock wait for the end of a run.
--versus OLD_CHOREO runs every configuration with that (older) binary too, taking turns with the new one, checks
that its outputs are the same, and ends with a table of new/old times (a refactor should show ratios near 1).
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


def documents(n, chars):
    """n distinct LongBench contexts, cut to about `chars` characters."""
    seen, docs = set(), []
    with open(os.path.join(os.environ.get("CHOREO_SHARED", os.path.join(ROOT, "..", "shared")),
                           "data", "longbench", "multifieldqa_en.jsonl")) as f:
        for line in f:
            ctx = json.loads(line)["context"]
            if ctx[:200] in seen:
                continue
            seen.add(ctx[:200])
            docs.append(ctx[:chars])
            if len(docs) == n:
                return docs
    sys.exit(f"only {len(docs)} distinct contexts")


def run(choreo, model, row, args, extra, warm=False):
    env = dict(os.environ)
    if args.cold and not warm:
        env["CHOREO_STORE_COLD_READS"] = "1"
    with machine_turn():
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
        try:
            return run_once(choreo, model, row, args, extra, env)
        finally:
            if busy:
                busy.kill()
                busy.wait()


def run_once(choreo, model, row, args, extra, env):
    with tempfile.NamedTemporaryFile(suffix=".json") as js, tempfile.NamedTemporaryFile(suffix=".txt") as tv, \
            tempfile.TemporaryDirectory() as store:
        # A fresh store per run: T2 holds only what this run evicted. Peak RSS from /usr/bin/time -v.
        cmd = ["/usr/bin/time", "-v", "-o", tv.name, choreo, "run", os.path.join(ROOT, "benchmarks", "workflows", "kvflow.yaml"), "-m", model,
               "--inputs", row, "--param", f"agents={args.agents}", "--param", f"rounds={args.rounds}",
               "-t", str(args.threads), "--json", js.name] + extra
        cmd += ["--cache-dir", os.path.join(store, "s")] if "--disk-cache-mib" in extra else ["--no-store"]
        t0 = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=env)
        wall = time.monotonic() - t0
        if p.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr}")
        doc = json.load(open(js.name))
        rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(tv.name).read()).group(1))
    inst = doc["instances"][0]
    outs = [m["text"] for m in inst["messages"] if m["kind"] == "decode"]
    prompt_tokens = [m["n_computed"] for m in inst["messages"] if m["name"].startswith("prompt[")]
    first_prefill_ms = sum(m["total_ms"] for m in inst["messages"] if m["name"].startswith("prompt["))
    tiers = dict(doc["tiers"])
    tiers["turns_s"] = wall - first_prefill_ms / 1000
    tiers["rss_mib"] = rss_kb / 1024
    return wall, tiers, outs, prompt_tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=DEFAULT_MODEL)
    ap.add_argument("--agents", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5, help="workflow rounds (turns per agent)")
    ap.add_argument("--hold", type=int, default=4, help="prompts T0 holds")
    ap.add_argument("--chars", type=int, default=8000, help="characters per document (~2048 tokens)")
    ap.add_argument("-r", "--repeat", type=int, default=3, help="measurement rounds")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--choreo", default=os.path.join(ROOT, "build", "choreo"))
    ap.add_argument("--cold", action="store_true", help="T2 reads without the page cache")
    ap.add_argument("--busy", action="store_true", help="a CPU-bound neighbour beside every run")
    ap.add_argument("--versus", metavar="OLD_CHOREO", help="also run every configuration with this binary")
    ap.add_argument("--configs", default="", help="comma-separated subset of the configurations")
    args = ap.parse_args()

    docs = documents(args.agents, args.chars)
    tmp = tempfile.mkdtemp()
    row = os.path.join(tmp, "row.jsonl")
    with open(row, "w") as f:
        f.write(json.dumps({"docs": docs}) + "\n")

    # Size T0 from the model's page size: one probe run with everything in T0.
    _, tiers, ref_out, prompt_tokens = run(args.choreo, args.model, row, args, ["--cache-mib", "8192"])
    peak_mib = tiers["t0_peak_bytes"] / 2**20
    per_prompt_mib = peak_mib / args.agents  # prompts dominate what the run holds
    t0_mib = int(per_prompt_mib * args.hold + per_prompt_mib) + 1
    t1_mib = int(peak_mib) + 64
    print(f"model {os.path.basename(args.model)}; {args.agents} agents x {args.rounds} rounds; prompts "
          f"{min(prompt_tokens)}-{max(prompt_tokens)} tokens; whole run holds {peak_mib:.0f} MiB; "
          f"T0 {t0_mib} MiB (~{args.hold} prompts), T1 {t1_mib} MiB", flush=True)
    t0 = ["--cache-mib", str(t0_mib)]
    t1 = ["--host-cache-mib", str(t1_mib)]
    t2 = ["--disk-cache-mib", str(t1_mib)]
    no_pf = ["--prefetch-steps", "0"]
    pf = ["--prefetch-steps", "2"]
    configs = {
        "all-fit": ["--cache-mib", "8192"],
        "lru-recomp": t0 + ["--evict", "lru"],
        "lru-reload": t0 + ["--evict", "lru"] + t1,
        "wf-recomp": t0 + ["--evict", "workflow"] + no_pf,
        "wf-reload": t0 + ["--evict", "workflow"] + t1 + no_pf,
        "wf-reload-pf": t0 + ["--evict", "workflow"] + t1 + pf,
        "lru-disk": t0 + ["--evict", "lru"] + t2,
        "wf-disk": t0 + ["--evict", "workflow"] + t2 + no_pf,
        "wf-disk-pf": t0 + ["--evict", "workflow"] + t2 + pf,
    }
    # The T2 configurations again with reads through the page cache, whatever --cold says.
    for c in ("lru-disk", "wf-disk", "wf-disk-pf"):
        configs[c + "-warm"] = configs[c]
    if args.configs:
        wanted = args.configs.split(",")
        unknown = [c for c in wanted if c not in configs]
        if unknown:
            sys.exit(f"unknown configurations {unknown}; known: {list(configs)}")
        configs = {c: configs[c] for c in wanted}
    binary = {c: args.choreo for c in configs}
    if args.versus:
        for c in list(configs):
            configs[c + " (old)"] = configs[c]
            binary[c + " (old)"] = args.versus
    print(f"T2 reads: {'cold (dropped from the page cache)' if args.cold else 'through the page cache'}; "
          f"{'a busy neighbour beside every run' if args.busy else 'no neighbour'}", flush=True)
    walls = {c: [] for c in configs}
    turn_times = {c: [] for c in configs}
    last = {}
    rss = {c: 0.0 for c in configs}
    for r in range(args.repeat):
        order = list(configs) if r % 2 == 0 else list(reversed(configs))
        for c in order:
            wall, tiers, outs, _ = run(binary[c], args.model, row, args, configs[c], warm="-warm" in c)
            if outs != ref_out:
                sys.exit(f"{c}: outputs differ from the all-fit run: tiers changed a result")
            walls[c].append(wall)
            turn_times[c].append(tiers["turns_s"])
            last[c] = tiers
            rss[c] = max(rss[c], tiers["rss_mib"])
            # On stdout: the raw figures behind every mean, range and per-round ratio (BENCHMARKS.md keeps them).
            print(f"  round {r + 1} {c}: {wall:.1f} s (turns {tiers['turns_s']:.1f} s)", flush=True)
    base_name = "lru-recomp" if "lru-recomp" in walls else next(iter(walls))
    base = statistics.mean(walls[base_name])
    print()
    print(f"| configuration | end-to-end s (mean, range) | vs {base_name} (mean; per-round range) | turns s (mean, "
          f"range) | vs {base_name}, turns (per-round range) | T0 evictions | "
          "T1 / T2 loads | prefetches (used, wasted; wait ms) | recomputed tokens | peak T0 / T1 MiB | T2 written MiB | "
          "peak RSS MiB (max) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in configs:
        m = statistics.mean(walls[c])
        t = last[c]
        turns = [x for x in turn_times[c]]
        # Each round's ratio against the base configuration's run of the same round.
        ratios = [b / w for b, w in zip(walls[base_name], walls[c])]
        turn_ratios = [b / w for b, w in zip(turn_times[base_name], turns)]
        print(f"| {c} | {m:.1f} ({min(walls[c]):.1f}-{max(walls[c]):.1f}) | {base / m:.2f}x "
              f"({min(ratios):.2f}-{max(ratios):.2f}) | {statistics.mean(turns):.1f} ({min(turns):.1f}-{max(turns):.1f}) | "
              f"{statistics.mean(turn_times[base_name]) / statistics.mean(turns):.2f}x "
              f"({min(turn_ratios):.2f}-{max(turn_ratios):.2f}) | {t['t0_evictions']} | "
              f"{t['t1_hits']} / {t['t2_hits']} | {t.get('prefetches', 0)} ({t.get('prefetch_used', 0)}, "
              f"{t.get('prefetch_wasted', 0)}; {t.get('prefetch_wait_ms', 0):.0f}) | {t['recomputed_tokens']} | "
              f"{t['t0_peak_bytes'] / 2**20:.0f} / {t['t1_peak_bytes'] / 2**20:.0f} | {t['t2_write_bytes'] / 2**20:.0f} | "
              f"{rss[c]:.0f} |")
    print(f"\nevery configuration gave the all-fit run's {len(ref_out)} outputs exactly")
    if args.versus:
        print(f"\n| configuration | new s (mean) | old s (mean) | new/old | per-round new/old |\n|---|---|---|---|---|")
        for c in configs:
            if c.endswith(" (old)"):
                continue
            new, old = walls[c], walls[c + " (old)"]
            per_round = [x / y for x, y in zip(new, old)]
            print(f"| {c} | {statistics.mean(new):.2f} | {statistics.mean(old):.2f} | "
                  f"{statistics.mean(new) / statistics.mean(old):.3f} | {min(per_round):.3f}-{max(per_round):.3f} |")


if __name__ == "__main__":
    main()
