#!/usr/bin/env python3
"""KV tiers on document QA: `choreo eval workflows/musique.yaml` over the first N MuSiQue items (each a PML
schema with one module per passage, ~6,200 tokens), with the passages encoded ahead of time by `choreo encode`
into T2 (the persistent store) and T3 (a Redis server this script starts), against cold runs that encode them
during the row. Every configuration must give the cold run's predictions (the script checks).

usage: scripts/bench_tiers_musique.py [-m MODEL] [--limit 10] [-r 5] [-t 2] [--busy] [--cache-type f32|f16|q8_0]

Configurations (choreo mode, one row at a time so each TTFT is its own):
  cold      no store: each row encodes its passages as modules, then decodes
  t2        the passages loaded from T2 (--cache-dir), entry files in the page cache
  t2-disk   the same with $CHOREO_STORE_COLD_READS=1: each entry is dropped from the page cache when opened,
            so its pages are read from the disk
  t3        the passages loaded from T3 (--redis, no --cache-dir)
--cache-type sets the KV cache type of keys and values for the encode and every run (f32 by default; an item's
passages hold 275 MiB of f32 KV, so all 150 items need 41 GiB in T2 and in Redis's memory, q8_0 about 11 GiB).
The encode ahead of time runs once, before the rounds, and is reported on its own. The configurations take
turns within each of the r rounds; figures are means over the rounds with the per-round range. TTFT is the
row's time to the first answer token; end-to-end is the row's time including the passages' encoding or
loading.
"""
import argparse
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from bench_lock import machine_turn
from choreo_cache import DEFAULT_MODEL

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("CHOREO_SHARED", os.path.join(ROOT, "..", "shared"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(tmp, password):
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--requirepass", password,
                             "--save", "", "--appendonly", "no", "--dir", tmp], stdout=subprocess.DEVNULL)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    sys.exit("redis-server did not start")


def deciles(xs):
    """p10, p50 and p90 of xs (nearest rank)."""
    xs = sorted(xs)
    return [xs[min(len(xs) - 1, int(q * len(xs)))] for q in (0.1, 0.5, 0.9)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=DEFAULT_MODEL)
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("-r", "--repeat", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--busy", action="store_true", help="a CPU-bound neighbour beside every run")
    ap.add_argument("--cache-type", default="f32", choices=["f32", "f16", "q8_0"], help="KV cache type (K and V)")
    ap.add_argument("--choreo", default=os.path.join(ROOT, "build", "choreo"))
    ap.add_argument("--data", default=os.path.join(SHARED, "data", "cacheblend_musique_s.json"))
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="choreo-bench-musique-")
    pml = os.path.join(tmp, "pml")
    store = os.path.join(tmp, "store")
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "musique_to_pml.py"), "--data", args.data, "--out",
                    pml], check=True, stdout=subprocess.DEVNULL)
    prompts = os.path.join(pml, "prompts.jsonl")
    schemas = [json.loads(line)["schema"] for line in open(prompts)][:args.limit]
    password = secrets.token_hex(8)
    redis, port = start_redis(tmp, password)
    env = dict(os.environ, CHOREO_REDIS_PASSWORD=password)
    redis_flags = ["--redis", f"127.0.0.1:{port}"]
    kv_flags = ["--cache-type-k", args.cache_type, "--cache-type-v", args.cache_type]
    busy = None
    try:
        if args.busy:
            busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        # Ahead of time: every item's passages into T2 and T3 in one pass.
        encode_s = 0.0
        for s in schemas:
            with machine_turn():
                t = time.monotonic()
                p = subprocess.run([args.choreo, "encode", s, "-m", args.model, "-t", str(args.threads), "--cache-dir",
                                    store] + redis_flags + kv_flags, env=env, capture_output=True, text=True)
                encode_s += time.monotonic() - t
            if p.returncode != 0:
                sys.exit(f"choreo encode {s} failed:\n{p.stderr[-3000:]}")
        store_mib = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(store) for f in fs) / 2**20

        configs = {
            "cold": ([], {}),
            "t2": (["--cache-dir", store], {}),
            "t2-disk": (["--cache-dir", store], {"CHOREO_STORE_COLD_READS": "1"}),
            "t3": (redis_flags, {}),
        }
        results = {k: [] for k in configs}  # per round: (wall, mean ttft, mean e2e, computed, predictions)
        for r in range(args.repeat):
            for k in (list(configs) if r % 2 == 0 else list(reversed(configs))):
                flags, extra_env = configs[k]
                out = os.path.join(tmp, f"{k}-{r}.jsonl")
                cmd = [args.choreo, "eval", os.path.join(ROOT, "workflows", "musique.yaml"), "--data", prompts,
                       "--allow-path", pml, "--metric", "qa_f1", "--mode", "choreo", "--concurrency", "1", "--limit",
                       str(args.limit), "-m", args.model, "-t", str(args.threads), "--out", out] + flags + kv_flags
                with machine_turn():
                    t = time.monotonic()
                    p = subprocess.run(cmd, env=dict(env, **extra_env), capture_output=True, text=True)
                    wall = time.monotonic() - t
                if p.returncode != 0:
                    sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
                rows = sorted((json.loads(line) for line in open(out)), key=lambda x: int(x["id"]))
                results[k].append((wall, statistics.mean(x["ttft_ms"] for x in rows),
                                   statistics.mean(x["e2e_ms"] for x in rows), sum(x["tokens_computed"] for x in rows),
                                   [x["prediction"] for x in rows], statistics.mean(x["score"] for x in rows),
                                   [x["e2e_ms"] for x in rows]))
                print(f"  round {r + 1} {k}: {wall:.1f} s", flush=True)  # the raw figures, kept with the table
    finally:
        if busy:
            busy.kill()
        redis.kill()
        redis.wait()

    ref = results["cold"][0][4]
    print(f"\n### MuSiQue, first {args.limit} items, {args.repeat} rounds, {args.threads} threads, "
          f"{'a busy neighbour' if args.busy else 'no neighbour'}; model {os.path.basename(args.model)}; "
          f"KV cache {args.cache_type}")
    print(f"Encoded ahead of time into T2 and T3 (`choreo encode --cache-dir S --redis ...`, {len(schemas)} schemas): "
          f"{encode_s:.1f} s, store {store_mib:.0f} MiB\n")
    print("| configuration | TTFT ms (mean, range) | end-to-end ms per row (mean, range) | vs cold (e2e) | run s "
          "(mean, range) | tokens computed | QA-F1 | predictions | end-to-end ms per row, p10 / p50 / p90 (last round) |")
    print("|---|---|---|---|---|---|---|---|---|")
    cold_e2e = statistics.mean(x[2] for x in results["cold"])
    for k, rs in results.items():
        same = all(x[4] == ref for x in rs)
        ttft, e2e, wall = [x[1] for x in rs], [x[2] for x in rs], [x[0] for x in rs]
        print(f"| {k} | {statistics.mean(ttft):.0f} ({min(ttft):.0f}-{max(ttft):.0f}) | "
              f"{statistics.mean(e2e):.0f} ({min(e2e):.0f}-{max(e2e):.0f}) | {cold_e2e / statistics.mean(e2e):.1f}x | "
              f"{statistics.mean(wall):.1f} ({min(wall):.1f}-{max(wall):.1f}) | {rs[-1][3]} | {100 * rs[-1][5]:.2f} | "
              f"{'same' if same else 'DIFFERENT'} | {' / '.join(f'{q:.0f}' for q in deciles(rs[-1][6]))} |", flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    if any(x[4] != ref for rs in results.values() for x in rs):
        sys.exit("predictions differ from the cold run: a tier changed a result")


if __name__ == "__main__":
    main()
