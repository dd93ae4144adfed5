#!/usr/bin/env python3
"""Prints llama.cpp's tokenization of test strings, as the reference for tests/model/vocab_test.cc.

Usage: tokenize_ref.py MODEL.gguf CASES.json

CASES.json is {"cases": [{"text": str, "add_special": bool, "parse_special": bool}, ...],
               "with_pieces": bool (optional, default true)}.
Prints one JSON object on stdout:
  tokens       list of id lists, one per case (llama_tokenize)
  pieces       hex bytes of llama_token_to_piece(id, special=True) for every id
  plain_pieces hex bytes of llama_token_to_piece(id, special=False) for every id
  eog, control ids for which llama_vocab_is_eog / llama_vocab_is_control hold
  bos, eos, eot, n_tokens
The model is loaded vocabulary-only (no weights, no context). Needs llama-cpp-python (scripts/setup.sh).
"""

import ctypes
import json
import sys

import llama_cpp


@llama_cpp.llama_log_callback
def _quiet(level, text, user_data):  # keep stdout clean; llama.cpp logs a lot while loading
    pass


def tokenize(vocab, text: bytes, add_special: bool, parse_special: bool) -> list:
    capacity = len(text) + 16
    while True:
        buffer = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(vocab, text, len(text), buffer, capacity, add_special, parse_special)
        if n >= 0:
            return list(buffer[:n])
        capacity = -n


def piece(vocab, token: int, special: bool) -> bytes:
    capacity = 64
    while True:
        buffer = ctypes.create_string_buffer(capacity)
        n = llama_cpp.llama_token_to_piece(vocab, token, buffer, capacity, 0, special)
        if n >= 0:
            return buffer.raw[:n]
        capacity = -n


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    model_path, cases_path = sys.argv[1], sys.argv[2]

    llama_cpp.llama_log_set(_quiet, ctypes.c_void_p())
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(model_path.encode(), params)
    if not model:
        print(f"llama.cpp could not load {model_path}", file=sys.stderr)
        return 1
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_tokens = llama_cpp.llama_vocab_n_tokens(vocab)
    with open(cases_path, encoding="utf-8") as f:
        request = json.load(f)
    cases = request["cases"]
    token_ids = range(n_tokens) if request.get("with_pieces", True) else range(0)

    result = {
        "tokens": [tokenize(vocab, c["text"].encode("utf-8"), c["add_special"], c["parse_special"]) for c in cases],
        "pieces": [piece(vocab, t, True).hex() for t in token_ids],
        "plain_pieces": [piece(vocab, t, False).hex() for t in token_ids],
        "eog": [t for t in range(n_tokens) if llama_cpp.llama_vocab_is_eog(vocab, t)],
        "control": [t for t in range(n_tokens) if llama_cpp.llama_vocab_is_control(vocab, t)],
        "bos": llama_cpp.llama_vocab_bos(vocab),
        "eos": llama_cpp.llama_vocab_eos(vocab),
        "eot": llama_cpp.llama_vocab_eot(vocab),
        "n_tokens": n_tokens,
    }
    json.dump(result, sys.stdout)
    llama_cpp.llama_model_free(model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
