#!/usr/bin/env python3
"""choreo bench vs llama.cpp (llama-cpp-python) on the same GGUF files, same threads, same run.
Prints a Markdown table with the ratio ours/theirs for every test.

usage: scripts/bench_compare.py MODEL.gguf [MODEL.gguf ...] [-t 2] [-r 5] [-p 512] [-n 128]

The two tools take turns: each of the r rounds runs `choreo bench -r 1` and llama.cpp's `-r 1` back to back
(alternating which goes first), each after its own warm-up. On a shared machine the memory bandwidth a decode
gets drifts over minutes (a 1B decode measured 20 to 30 tok/s within ten minutes); taking turns exposes both
tools to the same drift, where measuring all of one tool's repetitions first would not. Each figure is the mean
± standard deviation over the rounds; "ratio" is the ratio of the means, with the range of the per-round
ratios.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return {r["test"]: r["avg_ts"] for r in json.loads(out.stdout)}


def mean_sd(xs):
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


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
        common = ["-p", str(a.p), "-n", str(a.n), "-t", str(a.t), "-r", "1"]
        ours_cmd = [choreo, "bench", "-m", m, "--json"] + common
        theirs_cmd = [sys.executable, ref, m] + common
        ours, theirs = {}, {}
        for round_ in range(a.r):
            order = [(ours_cmd, ours), (theirs_cmd, theirs)]
            if round_ % 2:
                order.reverse()
            for cmd, into in order:
                for test, ts in run_json(cmd).items():
                    into.setdefault(test, []).append(ts)
        for test in ours:
            o, t = ours[test], theirs[test]
            per_round = [x / y for x, y in zip(o, t)]
            rows.append((os.path.basename(m), test, *mean_sd(o), *mean_sd(t), statistics.mean(o) / statistics.mean(t),
                         min(per_round), max(per_round)))
    print("| model | test | choreo t/s | llama.cpp t/s | ratio | per-round ratios |")
    print("|---|---|---:|---:|---:|---:|")
    for name, test, o, os_, t, ts, r, lo, hi in rows:
        print(f"| {name} | {test} | {o:.1f} ± {os_:.1f} | {t:.1f} ± {ts:.1f} | {r:.2f}x | {lo:.2f}–{hi:.2f} |")


if __name__ == "__main__":
    main()
