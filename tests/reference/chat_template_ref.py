#!/usr/bin/env python3
"""Prints reference chat renderings for tests/model/chat_template_test.cc.

Usage: chat_template_ref.py CONVERSATIONS.json [MODEL.gguf]

CONVERSATIONS.json is a list of {"messages": [{"role": str, "content": str}, ...],
"add_generation_prompt": bool}. Prints a JSON list with, per conversation:
  chatml, llama3, llama2-sys  llama.cpp's built-in templates (llama_chat_apply_template by name)
  jinja                       MODEL's own tokenizer.chat_template rendered with jinja2 the way
                              transformers does (only when MODEL is given)
Needs llama-cpp-python and jinja2 (scripts/setup.sh).
"""

import ctypes
import json
import sys

import jinja2.sandbox
import llama_cpp


@llama_cpp.llama_log_callback
def _quiet(level, text, user_data):
    pass


def builtin(name: str, messages: list, add_generation_prompt: bool) -> str:
    array = (llama_cpp.llama_chat_message * max(1, len(messages)))()
    keep = []  # the byte strings must outlive the call
    for i, m in enumerate(messages):
        role, content = m["role"].encode(), m["content"].encode()
        keep += [role, content]
        array[i].role = role
        array[i].content = content
    capacity = 1024
    while True:
        buffer = ctypes.create_string_buffer(capacity)
        n = llama_cpp.llama_chat_apply_template(name.encode(), array, len(messages), add_generation_prompt,
                                                buffer, capacity)
        if n < 0:
            raise RuntimeError(f"llama.cpp does not know template {name}")
        if n <= capacity:
            return buffer.raw[:n].decode()
        capacity = n


def model_template(path: str) -> str:
    llama_cpp.llama_log_set(_quiet, ctypes.c_void_p())
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(path.encode(), params)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    template = llama_cpp.llama_model_chat_template(model, None)
    if not template:
        raise RuntimeError(f"{path} has no tokenizer.chat_template")
    return template.decode()


def main() -> int:
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1], encoding="utf-8") as f:
        conversations = json.load(f)
    jinja = None
    if len(sys.argv) == 3:
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        jinja = env.from_string(model_template(sys.argv[2]))
    out = []
    for c in conversations:
        messages, gen = c["messages"], c["add_generation_prompt"]
        rendered = {name: builtin(name, messages, gen) for name in ("chatml", "llama3", "llama2-sys")}
        if jinja is not None:
            rendered["jinja"] = jinja.render(messages=messages, add_generation_prompt=gen, bos_token="",
                                             eos_token="")
        out.append(rendered)
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
