#!/usr/bin/env python3
"""Writes a GGUF model with every weight converted to F32 by llama.cpp's own quantize tool (llama-cpp-python's
llama_model_quantize with LLAMA_FTYPE_ALL_F32, the same as `llama-quantize --allow-requantize IN OUT F32`).

    python3 tests/reference/llama_dequantize.py IN.gguf OUT.gguf

The F32 file holds exactly the values both engines dequantise the quantised weights to, so it runs the same model
without 8-bit activation quantisation. choreo's differential test uses it to check 32-token greedy continuations
on SmolLM2-135M-Instruct, which on the quantised file depend on the exact order of every float operation.
"""
import ctypes
import sys

import llama_cpp


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_ALL_F32
    params.allow_requantize = True
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(params))
    if rc != 0:
        print(f"llama_model_quantize failed with {rc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
