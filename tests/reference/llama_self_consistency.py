#!/usr/bin/env python3
"""How far llama.cpp (llama-cpp-python) is from itself on a quantised model, for reading choreo's differential
test (tests/model/llama_reference_test.cc) in context.

    python3 tests/reference/llama_self_consistency.py MODEL.gguf

Runs the differential test's SmolLM2 prompts through llama.cpp in its reference configuration (fp32 KV cache,
512-token batches, 2 threads, no flash attention) and in variants: 1-token and 7-token batches, 1 thread, and
llama.cpp's default fp16 KV cache. For each variant it prints how many of the 32-token greedy continuations are
identical to the reference's, and the worst max|dlogit| / logit range of the final prompt position.
"""
import json
import sys
from pathlib import Path

import numpy as np
from llama_cpp import Llama

# The differential test's prompts (also read by tests/model/llama_reference_test.cc).
with open(Path(__file__).with_name("smollm2_prompts.json"), encoding="utf-8") as _f:
    PROMPTS = json.load(_f)


def run(model, n_batch, threads, kv_type):
    llm = Llama(model_path=model, n_ctx=512, n_batch=n_batch, n_ubatch=n_batch, n_threads=threads,
                logits_all=False, verbose=False, type_k=kv_type, type_v=kv_type, flash_attn=False)
    greedy, final = [], []
    for prompt in PROMPTS:
        tokens = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
        llm.reset()
        llm.eval(tokens)
        logits = np.array(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)))
        final.append(logits)
        out = []
        for _ in range(32):
            tok = int(np.argmax(logits))
            if tok == llm.token_eos():
                break
            out.append(tok)
            llm.eval([tok])
            logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
        greedy.append(out)
    return greedy, final


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    model = sys.argv[1]
    ref_greedy, ref_final = run(model, 512, 2, 0)
    variants = [("1-token batches", 1, 2, 0), ("7-token batches", 7, 2, 0), ("1 thread", 512, 1, 0),
                ("fp16 KV cache (llama.cpp's default)", 512, 2, 1)]
    print(f"llama.cpp vs llama.cpp (fp32 KV, 512-token batches, 2 threads) on {len(PROMPTS)} prompts:")
    for name, n_batch, threads, kv_type in variants:
        greedy, final = run(model, n_batch, threads, kv_type)
        same = sum(a == b for a, b in zip(ref_greedy, greedy))
        worst = max(float(np.abs(a - b).max() / (a.max() - a.min())) for a, b in zip(ref_final, final))
        print(f"  {name:38s} {same:2d}/{len(PROMPTS)} greedy continuations identical; "
              f"worst max|dlogit| / range = {worst:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
