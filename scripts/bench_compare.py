#!/usr/bin/env python3
"""choreo bench against llama.cpp's own llama-bench and llama-batched-bench, on the same GGUF files, with the
same thread count, in one run. Prints Markdown tables with the ratio choreo/llama.cpp for every row.

usage: scripts/bench_compare.py [MODEL.gguf ...] [-t 2] [-r 5] [--rows idle,depth,busy,parallel]
                                [--depth 4096] [--depth-cache f32,f16] [--parallel 1,2,4,8,16]
                                [--peer python] [--versus OLD_CHOREO]

Models: by default SmolLM2-135M-Instruct Q4_1 (the one scripts/setup.sh installs) and the Llama-3.2-1B shape
in Q8_0 and Q4_0, made by `choreo model synth` into bench-models/ of choreo's cache (scripts/choreo_cache.py) when missing.

The peer: llama-bench and llama-batched-bench built natively from the llama.cpp source that the
llama-cpp-python sdist vendors (scripts/build_peer.sh builds and caches them on first use). `--peer python`
uses the older Python reference (tests/reference/llama_bench.py, llama-cpp-python's own build) instead.

Rows, each measured for both tools:
  idle      pp512 and tg128 (llama-bench -p 512 -n 128)
  depth     pp512 and tg128 with 4096 tokens already in the cache (-d 4096); choreo with its default f32 KV
            cache and with f16 (llama.cpp's default); --depth-cache picks which (a 16K-token depth costs
            minutes per fill: `--depth 16384 --depth-cache f32 -n 0` measures prefill alone)
  busy      tg128 while `stress-ng --cpu 1` keeps one core busy (both tools under the same load)
  parallel  decode throughput of B sequences decoded together, B = 1, 2, 4, 8, 16, each generating 32 tokens
            after a 128-token prompt (llama-batched-bench -npp 128 -ntg 32 -npl ...)

The tools take turns: every round runs each row's choreo command(s) and llama.cpp command back to back, each
with one repetition after its own warm-up, alternating which goes first (the two depth rows of choreo share
one llama.cpp run per round). On a shared machine the bandwidth a
decode gets drifts over minutes; taking turns exposes both tools to the same drift. Each figure is the mean
± standard deviation over the rounds; "ratio" is the ratio of the means, with the range of per-round ratios.

`--versus OLD_CHOREO` (a choreo binary of an earlier commit, e.g. one built by scripts/compare_binaries.sh) adds
that binary to every row as one more variant taking turns with the others (old and new swap places every other
round), and a last table gives new/old per test: a refactor that should change no speed shows ratios around 1
within the per-round range.

At the end: the machine's memory bandwidth (`bench_matmul stream`, measured before and after the rounds)
and, for every model, the bytes per second its idle decode reads (weight bytes per token x tokens/s).
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

from choreo_cache import CACHE, DEFAULT_MODEL

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BYTES_PER_ELEMENT = {"F32": 4.0, "F16": 2.0, "BF16": 2.0, "Q8_0": 34 / 32, "Q4_0": 18 / 32, "Q4_1": 20 / 32}


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def default_models(choreo):
    models = []
    smol = os.environ.get("CHOREO_MODEL") or DEFAULT_MODEL
    if os.path.exists(smol):
        models.append(smol)
    else:
        print(f"note: {smol} is missing (scripts/setup.sh installs it); skipped", file=sys.stderr)
    out_dir = os.path.join(CACHE, "bench-models")
    os.makedirs(out_dir, exist_ok=True)
    for t in ("q8_0", "q4_0"):
        path = os.path.join(out_dir, f"llama-3.2-1b-{t}.gguf")
        if not os.path.exists(path):
            print(f"making {path} (choreo model synth)", file=sys.stderr)
            run([choreo, "model", "synth", "--shape", "llama-3.2-1b", "--type", t, "-o", path + ".partial"])
            os.replace(path + ".partial", path)
        models.append(path)
    return models


def weight_bytes_per_token(choreo, model):
    """Bytes of weights one decode step reads: every tensor, except an untied model's token embeddings, of
    which it reads one row."""
    listing = run([choreo, "model", "info", "--tensors", model]).stdout
    total, tied = 0.0, True
    for m in re.finditer(r"^\s+(\S+)\s+(F32|F16|BF16|Q8_0|Q4_0|Q4_1)\s+\[([\d x]+)\]", listing, re.M):
        name, dtype, dims = m.group(1), m.group(2), [int(d) for d in m.group(3).split(" x ")]
        n = 1
        for d in dims:
            n *= d
        if name == "output.weight":
            tied = False
        total += n * BYTES_PER_ELEMENT[dtype]
        if name == "token_embd.weight":
            embd = n * BYTES_PER_ELEMENT[dtype]
    if not tied:
        total -= embd
    return total


def choreo_tests(cmd):
    return {r["test"]: r["avg_ts"] for r in json.loads(run(cmd).stdout)}


def llama_bench_tests(cmd):
    out = {}
    for r in json.loads(run(cmd).stdout):
        test = f"pp{r['n_prompt']}" if r["n_prompt"] > 0 else f"tg{r['n_gen']}"
        if r.get("n_depth", 0) > 0:
            test += f" @ d{r['n_depth']}"
        out[test] = r["avg_ts"]
    return out


def batched_bench_tests(cmd):
    out = {}
    for line in run(cmd).stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            out[f"tg{r['tg']} x{r['pl']}"] = r["speed_tg"]
    return out


def python_ref_tests(cmd):
    return {r["test"]: r["avg_ts"] for r in json.loads(run(cmd).stdout)}


class Neighbour:
    """One other CPU-bound process for the duration of a `with` block."""

    def __enter__(self):
        if shutil.which("stress-ng"):
            cmd = ["stress-ng", "--cpu", "1", "--timeout", "3600"]
        else:  # a busy loop, when stress-ng is not installed
            cmd = [sys.executable, "-c", "while True: pass"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait()


def bandwidth(bench_matmul, threads):
    out = run([bench_matmul, str(threads), "stream"]).stdout
    m = re.search(r"read ([\d.]+) GB/s, copy ([\d.]+) GB/s", out)
    return float(m.group(1)), float(m.group(2))


def mean_sd(xs):
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*")
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-r", type=int, default=5, help="rounds")
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--rows", default="idle,depth,busy,parallel")
    ap.add_argument("--depth", type=int, default=4096)
    ap.add_argument("--depth-cache", default="f32,f16", help="choreo's KV cache types in the depth row")
    ap.add_argument("--parallel", default="1,2,4,8,16")
    ap.add_argument("--parallel-n", type=int, default=32, help="tokens each parallel sequence generates")
    ap.add_argument("--peer", choices=["llama-bench", "python"], default="llama-bench")
    ap.add_argument("--versus", metavar="OLD_CHOREO", help="also run this (older) choreo binary in every row")
    ap.add_argument("--cuda", action="store_true",
                    help="on a GPU: choreo --backend cuda against llama.cpp's CUDA build with every layer offloaded "
                         "(-ngl 99); scripts/gpu_check.sh")
    a = ap.parse_args()
    rows = a.rows.split(",")
    choreo = os.environ.get("CHOREO_BIN", os.path.join(ROOT, "build", "choreo"))
    bench_matmul = os.path.join(os.path.dirname(choreo), "bench_matmul")
    models = a.models or default_models(choreo)
    if a.peer == "llama-bench":
        peer_dir = run([os.path.join(ROOT, "scripts", "build_peer.sh")] + (["--cuda"] if a.cuda else [])
                       ).stdout.strip().splitlines()[-1]
        llama_bench = os.path.join(peer_dir, "llama-bench")
        batched_bench = os.path.join(peer_dir, "llama-batched-bench")
    head = run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"]).stdout.strip()
    print(f"choreo {head}, {a.t} threads, {a.r} rounds, peer {a.peer}", file=sys.stderr)

    t = ["-t", str(a.t)]
    bw_before = bandwidth(bench_matmul, a.t) if os.path.exists(bench_matmul) else None
    # (model, [(row, ours_cmd)], ours_parser, theirs_cmd, theirs_parser, under load): each of llama.cpp's
    # commands runs once per round, paired with every choreo variant of it.
    pairs = []
    for m in models:
        ours = [choreo, "bench", "-m", m, "--json", "-r", "1"] + t + (["--backend", "cuda"] if a.cuda else [])
        offload = ["-ngl", "99"] if a.cuda else []
        if a.peer == "python":
            ref = [sys.executable, os.path.join(ROOT, "tests", "reference", "llama_bench.py"), m, "-r", "1"] + t
            if "idle" in rows:
                pairs.append((m, [("idle", ours + ["-p", str(a.p), "-n", str(a.n)])], choreo_tests,
                              ref + ["-p", str(a.p), "-n", str(a.n)], python_ref_tests, False))
            continue
        lb = [llama_bench, "-m", m, "-o", "json", "-r", "1"] + t + offload
        if "idle" in rows:
            pairs.append((m, [("idle", ours + ["-p", str(a.p), "-n", str(a.n)])], choreo_tests,
                          lb + ["-p", str(a.p), "-n", str(a.n)], llama_bench_tests, False))
        if "depth" in rows:
            d = ["-d", str(a.depth)]
            variants = [(f"depth {c}", ours + ["-p", str(a.p), "-n", str(a.n), "--cache-type-k", c,
                                                "--cache-type-v", c] + d) for c in a.depth_cache.split(",")]
            pairs.append((m, variants, choreo_tests, lb + ["-p", str(a.p), "-n", str(a.n)] + d,
                          llama_bench_tests, False))
        if "busy" in rows:
            pairs.append((m, [("busy", ours + ["-p", "0", "-n", str(a.n)])], choreo_tests,
                          lb + ["-p", "0", "-n", str(a.n)], llama_bench_tests, True))
        if "parallel" in rows:
            ctx = str(max(4096, 16 * (128 + a.parallel_n) * 2))
            pn = str(a.parallel_n)
            pairs.append((m, [("parallel", ours + ["-p", "0", "-n", pn, "--parallel", a.parallel,
                                                  "--parallel-prompt", "128"])], choreo_tests,
                          [batched_bench, "-m", m, "-c", ctx, "-b", "2048", "-ub", "512", "-npp", "128",
                           "-ntg", pn, "-npl", a.parallel, "--output-format", "jsonl"] + t + offload,
                          batched_bench_tests, False))

    if a.versus:
        old_head = "old"
        src = os.path.dirname(os.path.dirname(os.path.abspath(a.versus)))
        got = subprocess.run(["git", "-C", src, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        if got.returncode == 0 and got.stdout.strip():
            old_head = got.stdout.strip()
        for i, (m, variants, *rest) in enumerate(pairs):
            old = [(f"{row} ({old_head})", [a.versus] + cmd[1:]) for row, cmd in variants]
            pairs[i] = (m, variants + old, *rest)

    results = {}  # (model, row, test) -> (ours list, theirs list)
    for round_ in range(a.r):
        for m, variants, ours_parse, theirs_cmd, theirs_parse, busy in pairs:
            steps = [(row, cmd, ours_parse) for row, cmd in variants] + [(None, theirs_cmd, theirs_parse)]
            if a.versus and round_ % 4 >= 2:  # the old binary first in rounds 3-4, 7-8, ...
                half = (len(steps) - 1) // 2
                steps = steps[half:-1] + steps[:half] + steps[-1:]
            if round_ % 2:
                steps = steps[-1:] + steps[:-1]  # llama.cpp first in odd rounds
            got = {}
            for row, cmd, parse in steps:
                if busy:
                    with Neighbour():
                        got[row] = parse(cmd)
                else:
                    got[row] = parse(cmd)
            for row, _ in variants:
                for test, ts in got[row].items():
                    if test not in got[None]:
                        continue
                    o, th = results.setdefault((m, row, test), ([], []))
                    o.append(ts)
                    th.append(got[None][test])
            print(f"round {round_ + 1}/{a.r}: {os.path.basename(m)} {variants[0][0].split()[0]} done", file=sys.stderr)
    bw_after = bandwidth(bench_matmul, a.t) if os.path.exists(bench_matmul) else None

    print(f"choreo {head} against llama.cpp ({a.peer}), {a.t} threads, {a.r} rounds taking turns\n")
    print("| model | row | test | choreo t/s | llama.cpp t/s | ratio | per-round ratios |")
    print("|---|---|---|---:|---:|---:|---:|")
    idle_tg = {}
    for (m, row, test), (o, th) in results.items():
        per_round = [x / y for x, y in zip(o, th)]
        (om, osd), (tm, tsd) = mean_sd(o), mean_sd(th)
        label = row + (" (stress-ng --cpu 1)" if row == "busy" else "")
        print(f"| {os.path.basename(m)} | {label} | {test} | {om:.1f} ± {osd:.1f} | {tm:.1f} ± {tsd:.1f} | "
              f"{om / tm:.2f}x | {min(per_round):.2f}–{max(per_round):.2f} |")
        if row == "idle" and test.startswith("tg"):
            idle_tg[m] = (om, tm)
    if a.versus:
        print(f"\nchoreo {head} against {old_head} ({a.versus}), same rounds\n")
        print("| model | row | test | new t/s | old t/s | new/old | per-round new/old |")
        print("|---|---|---|---:|---:|---:|---:|")
        for (m, row, test), (o, _) in results.items():
            old = results.get((m, f"{row} ({old_head})", test))
            if not old or row.endswith(f"({old_head})"):
                continue
            per_round = [x / y for x, y in zip(o, old[0])]
            print(f"| {os.path.basename(m)} | {row} | {test} | {statistics.mean(o):.1f} | "
                  f"{statistics.mean(old[0]):.1f} | {statistics.mean(o) / statistics.mean(old[0]):.3f}x | "
                  f"{min(per_round):.3f}–{max(per_round):.3f} |")
    if bw_before:
        print(f"\nMemory bandwidth (bench_matmul {a.t} stream), before / after the rounds: read "
              f"{bw_before[0]:.1f} / {bw_after[0]:.1f} GB/s, copy {bw_before[1]:.1f} / {bw_after[1]:.1f} GB/s\n")
        read_bw = max(bw_before[0], bw_after[0])
        copy_bw = max(bw_before[1], bw_after[1])
        print("| model | weight bytes / token | choreo decode GB/s | of read bw | of copy bw | llama.cpp decode GB/s |")
        print("|---|---:|---:|---:|---:|---:|")
        for m, (om, tm) in idle_tg.items():
            wb = weight_bytes_per_token(choreo, m)
            print(f"| {os.path.basename(m)} | {wb / 1e6:.1f} MB | {wb * om / 1e9:.1f} | {wb * om / 1e9 / read_bw:.0%} | "
                  f"{wb * om / 1e9 / copy_bw:.0%} | {wb * tm / 1e9:.1f} |")


if __name__ == "__main__":
    main()
