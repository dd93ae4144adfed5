#!/usr/bin/env python3
"""choreo bench vs llama.cpp (llama-cpp-python) on the same GGUF files, same threads, same run.
Prints a Markdown table with the ratio ours/theirs for every test.

usage: scripts/bench_compare.py MODEL.gguf [MODEL.gguf ...] [-t 2] [-r 5] [-p 512] [-n 128]
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return {r["test"]: r for r in json.loads(out.stdout)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-r", type=int, default=5)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    a = ap.parse_args()
    choreo = os.environ.get("CHOREO_BIN", os.path.join(ROOT, "build", "choreo"))
    ref = os.path.join(ROOT, "tests", "reference", "llama_bench.py")
    rows = []
    for m in a.models:
        common = ["-p", str(a.p), "-n", str(a.n), "-t", str(a.t), "-r", str(a.r)]
        theirs = run_json([sys.executable, ref, m] + common)
        ours = run_json([choreo, "bench", "-m", m, "--json"] + common)
        for test in ours:
            o, t = ours[test], theirs[test]
            rows.append((os.path.basename(m), test, o["avg_ts"], o["stddev_ts"], t["avg_ts"], t["stddev_ts"],
                         o["avg_ts"] / t["avg_ts"]))
    print(f"| model | test | choreo t/s | llama.cpp t/s | ratio |")
    print(f"|---|---|---:|---:|---:|")
    for name, test, o, os_, t, ts, r in rows:
        print(f"| {name} | {test} | {o:.1f} ± {os_:.1f} | {t:.1f} ± {ts:.1f} | {r:.2f}x |")


if __name__ == "__main__":
    main()
