#!/usr/bin/env python3
"""llama.cpp's speed on a GGUF file, measured the way llama-bench does (through llama-cpp-python, which builds
llama.cpp from source on this machine): pp = one prompt of random tokens decoded in one micro-batch from an empty
cache; tg = single-token decodes from an empty cache. Prints JSON like `choreo bench --json`.

usage: llama_bench.py MODEL [-p 512] [-n 128] [-t 2] [-r 5]
"""
import argparse
import ctypes
import json
import random
import statistics
import time

import llama_cpp


@llama_cpp.llama_log_callback
def _QUIET(level, text, user_data):  # llama.cpp's loader logs go nowhere; results are the only output
    pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-r", type=int, default=5)
    a = ap.parse_args()

    llama_cpp.llama_log_set(_QUIET, ctypes.c_void_p())
    llama_cpp.llama_backend_init()
    mparams = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(a.model.encode(), mparams)
    if not model:
        raise SystemExit(f"llama.cpp could not load {a.model}")
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    bos = llama_cpp.llama_vocab_bos(vocab)
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = max(a.p, a.n) + 16
    cparams.n_batch = max(a.p, 1)
    cparams.n_ubatch = max(a.p, 1)
    cparams.n_threads = a.t
    cparams.n_threads_batch = a.t
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    mem = llama_cpp.llama_get_memory(ctx)
    rng = random.Random(1234)

    def decode(tokens):
        arr = (llama_cpp.llama_token * len(tokens))(*tokens)
        rc = llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(tokens)))
        if rc != 0:
            raise SystemExit(f"llama_decode failed: {rc}")

    def prompt_run():
        llama_cpp.llama_memory_clear(mem, True)
        toks = [rng.randrange(n_vocab) for _ in range(a.p)]
        toks[0] = bos if bos >= 0 else toks[0]
        t0 = time.perf_counter()
        decode(toks)
        llama_cpp.llama_synchronize(ctx)
        return time.perf_counter() - t0

    def gen_run():
        llama_cpp.llama_memory_clear(mem, True)
        tok = bos if bos >= 0 else rng.randrange(n_vocab)
        t0 = time.perf_counter()
        for _ in range(a.n):
            decode([tok])
            llama_cpp.llama_synchronize(ctx)
            tok = rng.randrange(n_vocab)
        return time.perf_counter() - t0

    out = []
    for name, n, fn in (("pp%d" % a.p, a.p, prompt_run), ("tg%d" % a.n, a.n, gen_run)):
        if n <= 0:
            continue
        fn()  # warm-up
        samples = [n / fn() for _ in range(a.r)]
        out.append({"model": a.model, "test": name, "threads": a.t, "avg_ts": statistics.mean(samples),
                    "stddev_ts": statistics.stdev(samples) if len(samples) > 1 else 0.0,
                    "samples_ts": samples, "backend": "llama.cpp " + llama_cpp.__version__})
    print(json.dumps(out, indent=2))
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)


if __name__ == "__main__":
    main()
