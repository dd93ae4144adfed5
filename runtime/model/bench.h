#pragma once
// `choreo bench`: prompt-processing and generation speed of a model, measured like llama-bench (random
// tokens, one warm-up repetition, mean ± standard deviation over the timed repetitions). With a depth, every
// test starts from a cache that already holds that many tokens (llama-bench -d); the depth is encoded once,
// untimed, and cut back to after each repetition. Parallel tests measure decode throughput of B sequences
// decoded together in one batch (as llama.cpp's batched-bench: each first gets its own prompt, untimed).

#include <string>
#include <vector>

#include "kernels/backend.h"
#include "runtime/model/llama.h"
#include "runtime/model/lora.h"

namespace choreo::model {

/// What bench measures (llama-bench's -p, -n, -r, -b, -d; batched-bench's parallel sequences).
struct BenchOptions {
  int n_prompt = 512;         ///< prompt tokens of the pp test (0: none)
  int n_gen = 128;            ///< generated tokens of the tg test and of each parallel test (0: none)
  int repetitions = 5;        ///< timed repetitions of each test
  int max_batch = 512;        ///< micro-batch of prompt processing, in tokens
  int n_depth = 0;            ///< tokens in the cache when each test starts
  std::vector<int> parallel;  ///< a parallel decode test for each number of sequences
  int parallel_prompt = 128;  ///< prompt tokens of each parallel sequence
};

/// One test's throughput over its repetitions.
struct BenchResult {
  std::string test;  ///< "pp512", "tg128", "pp512 @ d4096", "tg128 x8" (llama-bench's names)
  double mean_tokens_per_s = 0, stddev_tokens_per_s = 0;
  std::vector<double> samples_tokens_per_s;  ///< one per repetition, in order
};

/// InputError when `options` ask for nothing to measure, or for parallel tests without generation.
void check_bench_options(const BenchOptions& options);

/// Runs the tests `options` ask for on `model` (with `lora` over it when not null; KV pages of `layout`):
/// pp, then tg, then each parallel test, one result each. InputError (check_bench_options, or tests that need
/// more than the model's context).
std::vector<BenchResult> bench(const Model& model, const LoraStack* lora, const kernels::KvLayout& layout,
                               const BenchOptions& options);

}  // namespace choreo::model
