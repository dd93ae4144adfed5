#!/usr/bin/env python3
"""`choreo serve` against llama.cpp's `llama-server`, driven by the same client code: the `openai` package,
async, one task per agent. Prints per-step TTFT and end-to-end time for each server, and the ratios.

usage: scripts/bench_serve.py [-m MODEL.gguf] [-r 5] [-n 32] [-t 2] [--workflows madpar,tot]
                              [--servers choreo,choreo+refs,llama-server] [--busy] [--json OUT]

Workflows (prompts in this file; every generated length forced to -n tokens with ignore_eos, on every server):
  madpar  a MADpar debate: 3 agents x 3 rounds. Round 1: each agent answers the problem; rounds 2-3: each agent
          reads the problem and every agent's previous answers, then answers again. The agents of a round run
          at once (three tasks).
  tot     a Tree-of-Thoughts fan-out: 4 thoughts on the problem at once (a shared prompt, a different last
          line each), then a judge reading all 4.

Servers, each started fresh for every round (so every round starts with an empty cache), taking turns:
  choreo        `choreo serve` with plain requests (no extensions): the earlier answers are text in the prompt
  choreo+refs   `choreo serve` with choreo's extensions: the system prompt and the problem are named messages
                (choreo.id), each answer is named (choreo.output_id), and later requests list the earlier answers
                as item_reference entries, reused where they are read instead of computed again (the same
                content as the plain prompt, the answers as assistant turns; docs/serve.md)
  llama-server  built from the llama-cpp-python sdist's llama.cpp (scripts/build_peer.sh), prompt cache on,
                one slot per agent (-np 4), the same thread count

TTFT is measured by the client: request sent to first streamed text. End to end: the workflow's first request
sent to its last token received.
"""
import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from choreo_cache import DEFAULT_MODEL

ROOT = Path(__file__).resolve().parent.parent

PROBLEM = ("A farmer has 17 sheep. All but 9 run away. Then he buys twice as many sheep as he has left, and "
           "sells 5. How many sheep does he have now? Explain your reasoning step by step.")
SYSTEM = "You are a careful mathematician taking part in a debate. Be concise and precise."


def start(cmd, ready_text, env=None):
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    deadline = time.time() + 120
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if ready_text in line:
            return proc, line
    proc.kill()
    raise SystemExit(f"error: {cmd[0]} did not start:\n{''.join(lines[-20:])}")


def drain(proc):
    import threading
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_choreo(args):
    proc, line = start([str(args.choreo), "serve", "-m", args.model, "--port", "0", "-t", str(args.threads), "-q"],
                       "listening on")
    drain(proc)
    url = line.split("listening on ")[1].split(";")[0]
    model = line.split("models: ")[1].split(";")[0].split(",")[0].strip()
    return proc, url, model


def start_llama(args):
    port = free_port()
    proc, _ = start([str(args.llama_server), "-m", args.model, "--host", "127.0.0.1", "--port", str(port),
                     "-t", str(args.threads), "-np", "4", "-c", str(4 * 2048), "--no-ui"],
                    "listening on http")
    drain(proc)
    return proc, f"http://127.0.0.1:{port}", "model"


async def ask(client, model, messages, n, steps, step, choreo=None):
    t0 = time.perf_counter()
    ttft = None
    text = []
    extra = {"ignore_eos": True}
    if choreo is not None:
        extra["choreo"] = choreo
    stream = await client.chat.completions.create(model=model, messages=messages, max_tokens=n, temperature=0,
                                                  stream=True, extra_body=extra)
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if ttft is None:
                ttft = time.perf_counter() - t0
            text.append(chunk.choices[0].delta.content)
    steps.setdefault(step, []).append(ttft if ttft is not None else time.perf_counter() - t0)
    return "".join(text)


async def madpar(client, model, n, steps):
    answers = [None] * 3
    for r in range(3):
        async def agent(i):
            msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROBLEM}]
            if r > 0:
                debate = "\n\n".join(f"Agent {j + 1}: {a}" for j, a in enumerate(answers))
                msgs.append({"role": "user", "content": f"Round {r} answers:\n{debate}\n\nYou are agent {i + 1}. "
                                                        "Reconsider and give your updated answer."})
            return await ask(client, model, msgs, n, steps, f"round {r + 1}")
        answers = await asyncio.gather(*(agent(i) for i in range(3)))
    return answers


async def tot(client, model, n, steps):
    base = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROBLEM}]
    thoughts = await asyncio.gather(*(
        ask(client, model, base + [{"role": "user", "content": f"Propose approach {k + 1} of 4, different from "
                                                               "the others."}], n, steps, "thoughts")
        for k in range(4)))
    judged = "\n\n".join(f"Approach {k + 1}: {t}" for k, t in enumerate(thoughts))
    return await ask(client, model, base + [{"role": "user", "content": f"{judged}\n\nWhich approach is best, "
                                                                        "and what is the answer?"}], n, steps, "judge")


# The same workflows with choreo's extensions: shared messages are named once, answers by their output ids, and
# later requests name them with item_reference entries instead of resending them as text.
NAMED = [{"role": "system", "content": SYSTEM, "choreo": {"id": "system"}},
         {"role": "user", "content": PROBLEM, "choreo": {"id": "problem"}}]
REFS = [{"type": "item_reference", "id": "system"}, {"type": "item_reference", "id": "problem"}]


async def madpar_refs(client, model, n, steps):
    answers = []
    for r in range(3):
        async def agent(i):
            if r == 0:
                msgs = NAMED
            else:
                msgs = REFS + [{"type": "item_reference", "id": a} for a in answers] + [
                    {"role": "user", "content": f"Above are the round {r} answers of agents 1-3. You are agent "
                                                f"{i + 1}. Reconsider and give your updated answer."}]
            await ask(client, model, msgs, n, steps, f"round {r + 1}", {"output_id": f"round{r}-agent{i}"})
            return f"round{r}-agent{i}"
        answers = await asyncio.gather(*(agent(i) for i in range(3)))
    return answers


async def tot_refs(client, model, n, steps):
    async def thought(k):
        # Each sends the shared messages with their names: the first request to arrive makes them, the others
        # (the same names and texts) read them.
        msgs = NAMED + [{"role": "user", "content": f"Propose approach {k + 1} of 4, different from the others."}]
        await ask(client, model, msgs, n, steps, "thoughts", {"output_id": f"thought{k}"})
    await asyncio.gather(*(thought(k) for k in range(4)))
    msgs = REFS + [{"type": "item_reference", "id": f"thought{k}"} for k in range(4)] + [
        {"role": "user", "content": "Above are approaches 1-4. Which approach is best, and what is the answer?"}]
    return await ask(client, model, msgs, n, steps, "judge", {"output_id": "judge"})


CLIENTS = {("choreo", "madpar"): madpar, ("choreo", "tot"): tot, ("llama-server", "madpar"): madpar,
           ("llama-server", "tot"): tot, ("choreo+refs", "madpar"): madpar_refs, ("choreo+refs", "tot"): tot_refs}


def run_once(args, which, workflow):
    import openai
    proc, url, model = start_llama(args) if which == "llama-server" else start_choreo(args)
    try:
        steps = {}

        async def go():
            async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as client:
                t0 = time.perf_counter()
                await CLIENTS[(which, workflow)](client, model, args.n, steps)
                return time.perf_counter() - t0

        return asyncio.run(go()), steps
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def busy_neighbour(enabled):
    if not enabled:
        return None
    return subprocess.Popen(["stress-ng", "--cpu", "1", "--quiet"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", default=DEFAULT_MODEL)
    p.add_argument("-r", "--rounds", type=int, default=5)
    p.add_argument("-n", type=int, default=32, help="tokens every request generates (forced)")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--workflows", default="madpar,tot")
    p.add_argument("--servers", default="choreo,choreo+refs,llama-server",
                   help="which of choreo, choreo+refs, llama-server to run (in this order, rotated each round)")
    p.add_argument("--busy", action="store_true", help="with stress-ng --cpu 1 running beside")
    p.add_argument("--choreo", default=str(ROOT / "build" / "choreo"))
    p.add_argument("--llama-server", default=None)
    p.add_argument("--json", help="write every round's figures here")
    args = p.parse_args()
    servers = args.servers.split(",")
    if set(servers) - {"choreo", "choreo+refs", "llama-server"}:
        raise SystemExit(f"error: --servers takes choreo, choreo+refs, llama-server; got {args.servers}")
    if args.llama_server is None and "llama-server" in servers:
        peer = subprocess.run([str(ROOT / "scripts" / "build_peer.sh")], capture_output=True, text=True, check=True)
        args.llama_server = str(Path(peer.stdout.strip()) / "llama-server")

    raw = {}
    neighbour = busy_neighbour(args.busy)
    try:
        for wf in args.workflows.split(","):
            for r in range(args.rounds):
                order = servers[r % len(servers):] + servers[:r % len(servers)]
                for which in order:
                    e2e, steps = run_once(args, which, wf)
                    raw.setdefault(wf, {}).setdefault(which, []).append({"e2e_s": e2e, "ttft_s": steps})
                    print(f"{wf} round {r + 1} {which}: end to end {e2e:.2f} s; TTFT "
                          + ", ".join(f"{k} {statistics.mean(v) * 1000:.0f} ms" for k, v in steps.items()),
                          file=sys.stderr, flush=True)
    finally:
        if neighbour:
            neighbour.terminate()
    print_table(args, servers, raw)
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=1))


def print_table(args, servers, raw):
    peer = "llama-server" if "llama-server" in servers else None
    ours = [s for s in servers if s != "llama-server"]
    print(f"\n## choreo serve vs llama-server ({Path(args.model).name}, -t {args.threads}, {args.n} tokens per "
          f"request, {args.rounds} rounds{', busy neighbour' if args.busy else ''})\n")
    header = ["workflow", "step"] + [f"{s} ms" for s in servers]
    if peer:
        header += [f"llama-server / {s} (range)" for s in ours]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for wf, runs in raw.items():
        for step in list(runs[servers[0]][0]["ttft_s"].keys()) + ["end to end"]:
            def per_round(which):
                if step == "end to end":
                    return [x["e2e_s"] for x in runs[which]]
                return [statistics.mean(x["ttft_s"][step]) for x in runs[which]]
            row = [wf, step if step == "end to end" else f"{step} TTFT"]
            row += [f"{statistics.mean(per_round(s)) * 1000:.0f}" for s in servers]
            if peer:
                for s in ours:
                    ratios = [b / a for a, b in zip(per_round(s), per_round(peer))]
                    row.append(f"{statistics.mean(per_round(peer)) / statistics.mean(per_round(s)):.2f}x "
                               f"({min(ratios):.2f}-{max(ratios):.2f})")
            print("| " + " | ".join(row) + " |")
    if peer:
        print("\nRatios are llama-server's time over choreo's (above 1: choreo is faster); the range is over rounds.")


if __name__ == "__main__":
    main()
