#!/usr/bin/env python3
"""llama.cpp's answers (via llama-cpp-python) for choreo's differential tests.

Reads JSON from stdin: {"model": path, "prompts": [str], "n_predict": int, "threads": int, and optionally
"type_k", "type_v": the KV cache types as ggml type ids (default 0, f32), and "loras": [[adapter path, scale],
...]: LoRA adapters applied together, as llama.cpp's --lora-scaled}
Writes JSON to stdout: {"results": [{"tokens": [...], "greedy": [...], "logits_b64": base64 float32 of the
final prompt position's logits}], "n_vocab": int}
Tokenisation adds BOS as the vocab says and parses special tokens, like `choreo generate`.
"""
import base64
import ctypes
import json
import sys

import numpy as np
import llama_cpp
from llama_cpp import Llama


def last_logits(llm: Llama) -> np.ndarray:
    # With logits_all=False llama.cpp keeps only the last evaluated position's logits.
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).astype(np.float32)


def main() -> None:
    req = json.load(sys.stdin)
    llm = Llama(model_path=req["model"], n_ctx=req.get("n_ctx", 512), n_batch=512,
                n_threads=req.get("threads", 2), logits_all=False, verbose=False, seed=0,
                # fp32 KV by default (llama.cpp defaults to fp16) so the comparison measures the engines, not
                # cache rounding. A quantised V cache needs llama.cpp's flash attention.
                type_k=req.get("type_k", 0), type_v=req.get("type_v", 0),
                flash_attn=req.get("type_v", 0) not in (0, 1))
    loras = req.get("loras", [])
    if loras:
        adapters = []
        for path, _ in loras:
            adapter = llama_cpp.llama_adapter_lora_init(llm._model.model, path.encode("utf-8"))
            if not adapter:
                sys.exit(f"llama.cpp could not load the LoRA adapter {path}")
            adapters.append(adapter)
        array = (llama_cpp.llama_adapter_lora_p_ctypes * len(adapters))(*adapters)
        scales = (ctypes.c_float * len(loras))(*[float(scale) for _, scale in loras])
        if llama_cpp.llama_set_adapters_lora(llm._ctx.ctx, array, len(adapters), scales):
            sys.exit("llama.cpp could not set the LoRA adapters")
    results = []
    for prompt in req["prompts"]:
        tokens = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
        llm.reset()
        llm.eval(tokens)
        logits = last_logits(llm)
        greedy = []
        last = logits
        for _ in range(req["n_predict"]):
            tok = int(np.argmax(last))
            if llm.token_eos() == tok:
                break
            greedy.append(tok)
            llm.eval([tok])
            last = last_logits(llm)
        results.append({"tokens": tokens, "greedy": greedy,
                        "logits_b64": base64.b64encode(logits.tobytes()).decode("ascii")})
    json.dump({"results": results, "n_vocab": llm.n_vocab()}, sys.stdout)


if __name__ == "__main__":
    main()
