#!/usr/bin/env python3
"""The cost of `choreo finetune train` (BENCHMARKS.md): training throughput against the forward-only speed of
the same graph, and peak memory, over several rounds, on an idle machine and with a busy neighbour
(`stress-ng --cpu 1`), the two taking turns round by round.

Each round trains one epoch over the first --train traces of TRAIN_TRACES with the first --val traces of
VAL_TRACES as validation (`--val-traces`), and reads the run's own report: training tokens/s (forward,
backward and the AdamW step, with the epoch's validation pass) and forward-only tokens/s (the validation
traces' forward pass, timed before training), and the peak RSS from /usr/bin/time -v.

  scripts/bench_finetune_speed.py WORKFLOW TRAIN_TRACES VAL_TRACES [-r 5] [--train 6] [--val 2] [--bin build/choreo]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_compare import Neighbour  # noqa: E402


def head(path, n, out):
    with open(path) as f, open(out, "w") as o:
        for i, line in enumerate(f):
            if i >= n:
                break
            o.write(line)


def one_round(args, train, val, out_dir):
    adapter = os.path.join(out_dir, "a.gguf")
    for f in (adapter, adapter + ".ckpt"):
        if os.path.exists(f):
            os.remove(f)
    cmd = ["/usr/bin/time", "-v", args.bin, "finetune", "train", args.workflow, "--traces", train, "--val-traces", val,
           "--epochs", "1", "--seed", "1", "-o", adapter]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"bench_finetune_speed: {' '.join(cmd)} failed:\n{p.stderr}")
    m = re.search(r"training (\d+) tokens/s .* forward only (\d+) tokens/s", p.stdout)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
    return int(m.group(1)), int(m.group(2)), int(rss.group(1)) / 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workflow")
    ap.add_argument("train_traces")
    ap.add_argument("val_traces")
    ap.add_argument("-r", "--rounds", type=int, default=5)
    ap.add_argument("--train", type=int, default=6)
    ap.add_argument("--val", type=int, default=2)
    ap.add_argument("--bin", default="build/choreo")
    args = ap.parse_args()
    results = {"idle": [], "busy": []}
    with tempfile.TemporaryDirectory() as d:
        train, val = os.path.join(d, "train.jsonl"), os.path.join(d, "val.jsonl")
        head(args.train_traces, args.train, train)
        head(args.val_traces, args.val, val)
        for r in range(args.rounds):
            order = ["idle", "busy"] if r % 2 == 0 else ["busy", "idle"]
            for which in order:
                if which == "busy":
                    with Neighbour():
                        res = one_round(args, train, val, d)
                else:
                    res = one_round(args, train, val, d)
                results[which].append(res)
                print(f"round {r + 1} {which}: training {res[0]} tokens/s, forward {res[1]} tokens/s, "
                      f"peak RSS {res[2]:.0f} MiB", flush=True)
    print(f"\n| machine | training tokens/s (mean, range) | forward-only tokens/s (mean, range) | training / forward | peak RSS MiB |")
    print("|---|---|---|---|---|")
    for which, rows in results.items():
        t, f, m = zip(*rows)
        print(f"| {which} | {statistics.mean(t):.0f} ({min(t)}-{max(t)}) | {statistics.mean(f):.0f} ({min(f)}-{max(f)}) | "
              f"{statistics.mean(t) / statistics.mean(f):.2f} | {max(m):.0f} |")


if __name__ == "__main__":
    main()
