#!/usr/bin/env python3
"""Cross-model plans: how long a sibling model takes to read passages another model encoded, per plan.

The base model (-m) encodes one MuSiQue item's passages; a sibling (the base with --lora ADAPTER) then decodes
one token over them, reading them through the plan under test (docs/workflow-language.md, "Models"). The time
to its first token includes making its encoding of the passages: the whole prefill (`recompute`), layers s..e-1
from the saved E cache (`partial`), or nothing (`reuse`). Each configuration is its own `choreo run` process;
the configurations take turns within each of the rounds. Quality is not measured here (that is the reuse
profiler's job, not built yet).

usage: scripts/bench_plans.py --lora ADAPTER [-m MODEL] [--item 0] [-r 5] [--plans recompute,10-15,0-30,reuse]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_lock import machine_turn  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def workflow(lora, plan):
    if plan == "recompute":
        reuse = ""
    elif plan == "reuse":
        reuse = ", reuse: {from: default, plan: reuse}"
    else:
        s, e = plan.split("-")
        reuse = f", reuse: {{from: default, plan: partial, layers: [{s}, {e}]}}"
    return f"""name: plans
inputs: {{ctx: string}}
models:
  sibling: {{lora: {json.dumps(lora)}{reuse}}}
messages:
  passages: {{role: user, text: "{{{{ ctx }}}}"}}
steps:
  - decode: {{as: answer, model: sibling, parents: [passages], role: assistant, max_tokens: 1, temperature: 0}}
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="")
    ap.add_argument("--lora", required=True)
    ap.add_argument("--data", default=os.path.join(os.environ.get("CHOREO_SHARED", os.path.join(ROOT, "..", "shared")),
                                                   "data", "cacheblend_musique_s.json"))
    ap.add_argument("--item", type=int, default=0)
    ap.add_argument("-r", "--repeat", type=int, default=5)
    ap.add_argument("--plans", default="recompute,10-15,0-30,reuse")
    ap.add_argument("--choreo", default=os.path.join(ROOT, "build", "choreo"))
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args()
    item = json.load(open(a.data))[a.item]
    ctx = "\n\n".join(f"{c['title']}\n{c['text']}" for c in item["ctxs"]) + "\n\nQuestion: " + item["question"]
    plans = a.plans.split(",")
    times = {p: [] for p in plans}
    tokens = None
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(a.repeat):
            order = plans[rnd % len(plans):] + plans[:rnd % len(plans)]
            for plan in order:
                wf = os.path.join(tmp, "plans.yaml")
                with open(wf, "w") as f:
                    f.write(workflow(os.path.abspath(a.lora), plan))
                out = os.path.join(tmp, "run.json")
                cmd = [a.choreo, "run", wf, "--no-store", "-t", str(a.threads), "--input", "ctx=" + ctx, "--json", out]
                if a.model:
                    cmd += ["-m", a.model]
                with machine_turn():
                    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                msgs = {m["name"]: m for m in json.load(open(out))["messages"]}
                tokens = len(msgs["passages"]["tokens"])
                times[plan].append(msgs["answer"]["ttft_ms"])
                print(f"  round {rnd + 1} {plan}: {msgs['answer']['ttft_ms']:.1f} ms", file=sys.stderr)
    base = statistics.mean(times["recompute"]) if "recompute" in times else None
    print(f"item {a.item}: {tokens} passage tokens; the sibling's time to its first token over them "
          f"(ms, mean and per-round range), {a.repeat} rounds")
    print("| plan | TTFT ms | vs recompute (per round) |")
    print("|---|---|---|")
    for p in plans:
        t = times[p]
        label = p if p in ("recompute", "reuse") else f"partial [{p.replace('-', ', ')})"
        ratio = ""
        if base:
            per = [r / x for r, x in zip(times["recompute"], t)]
            ratio = f"{base / statistics.mean(t):.2f}x ({min(per):.2f}-{max(per):.2f})"
        print(f"| {label} | {statistics.mean(t):.1f} ({min(t):.1f}-{max(t):.1f}) | {ratio} |")


if __name__ == "__main__":
    main()
