#pragma once
// How many tokens a prefix-caching chat baseline would compute for the calls of a run — counted, not timed
// (the summary line of `choreo run`; docs/exec.md, "Token accounting"). The baseline is what a chat server
// with automatic prefix caching (vLLM, SGLang, llama.cpp's server with cache_prompt) does with the same
// calls: each decode is one request whose prompt is the BOS (when the model adds one), its parents' tokens
// in placement order and its header (a prefill is no request: a chat API has no such call; its text is
// sent again inside the prompts of the decodes that list it). The decodes of one engine batch are concurrent
// requests, so each reuses only what earlier batches left: the longest token prefix the
// prompt shares with any earlier batch's prompt-plus-generation is reused (as vLLM's automatic prefix
// caching and SGLang's radix cache keep generated tokens too), the rest computed; a decode then feeds back
// every token it generates but the last, as choreo's own decodes count them.

#include <cstdint>

#include "runtime/exec/interpreter.h"

namespace choreo::exec {

struct BaselineCount {
  int64_t calls = 0;     ///< requests: the run's decodes
  int64_t computed = 0;  ///< prompt tokens not in the prefix cache, plus generated tokens
  int64_t reused = 0;    ///< prompt tokens served from the prefix cache
};

/// Counts the baseline for `result`'s decodes, in the order the run made them; `bos` is the model's BOS
/// token, or negative for none.
BaselineCount prefix_baseline(const RunResult& result, int32_t bos);

}  // namespace choreo::exec
