#include "runtime/model/bench.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <random>

#include "common/error.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/session.h"

namespace choreo::model {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

BenchResult summarize(std::string test, int n_tokens, const std::vector<double>& seconds) {
  BenchResult r;
  r.test = std::move(test);
  for (double s : seconds) r.samples_tokens_per_s.push_back(n_tokens / s);
  for (double t : r.samples_tokens_per_s) r.mean_tokens_per_s += t;
  r.mean_tokens_per_s /= double(r.samples_tokens_per_s.size());
  for (double t : r.samples_tokens_per_s)
    r.stddev_tokens_per_s += (t - r.mean_tokens_per_s) * (t - r.mean_tokens_per_s);
  r.stddev_tokens_per_s = r.samples_tokens_per_s.size() > 1
                              ? std::sqrt(r.stddev_tokens_per_s / double(r.samples_tokens_per_s.size() - 1))
                              : 0.0;
  return r;
}

/// The tests of one bench: the model, its pool, and one random stream for every test's tokens in turn.
class Bench {
 public:
  Bench(const Model& model, const LoraStack* lora, const kernels::KvLayout& layout,
        const BenchOptions& options)
      : m_(model),
        lora_(lora),
        o_(options),
        pool_(model.backend(), layout, kv::budget_within_device(model.backend(), size_t(8) << 30)),
        session_(model, pool_, options.max_batch) {
    session_.set_lora(lora);
    if (o_.n_depth > 0) session_.eval(random_tokens(o_.n_depth), &logits_);  // the starting cache, untimed
  }

  /// pp: the prompt in micro-batches, after the depth.
  BenchResult prompt() {
    return repeat(fmt::format("pp{}{}", o_.n_prompt, at_depth()), o_.n_prompt, [&] {
      const std::vector<Token> tokens = test_tokens(o_.n_prompt);
      const auto start = Clock::now();
      session_.eval(tokens, &logits_);
      return seconds_since(start);
    });
  }

  /// tg: one token per step, after the depth.
  BenchResult generation() {
    return repeat(fmt::format("tg{}{}", o_.n_gen, at_depth()), o_.n_gen, [&] {
      const std::vector<Token> tokens = test_tokens(o_.n_gen);
      const auto start = Clock::now();
      for (int i = 0; i < o_.n_gen; ++i)
        session_.eval(std::span<const Token>(&tokens[size_t(i)], 1), &logits_);
      return seconds_since(start);
    });
  }

  /// `n_sequences` sequences, each with its own prompt (untimed), then n_gen decode steps of all of them
  /// together; the rate counts every sequence's tokens.
  BenchResult parallel(int n_sequences) {
    return repeat(fmt::format("tg{} x{}", o_.n_gen, n_sequences), o_.n_gen * n_sequences, [&] {
      std::vector<std::unique_ptr<Session>> owned;
      std::vector<Session*> sequences;
      for (int i = 0; i < n_sequences; ++i) {
        owned.push_back(std::make_unique<Session>(m_, pool_, o_.max_batch));
        owned.back()->set_lora(lora_);
        sequences.push_back(owned.back().get());
        if (o_.parallel_prompt > 0) sequences.back()->eval(random_tokens(o_.parallel_prompt), &logits_);
      }
      std::vector<Token> step(size_t(n_sequences), 0);
      const auto start = Clock::now();
      for (int i = 0; i < o_.n_gen; ++i) {
        for (Token& t : step) t = Token(rng_() % uint32_t(m_.config().n_vocab));
        Session::decode_together(sequences, step, &logits_);
      }
      return seconds_since(start);
    });
  }

 private:
  /// Runs `once` a warm-up and `repetitions` timed times; each run returns its seconds.
  template <class Once>
  BenchResult repeat(std::string test, int n_tokens, Once once) {
    std::vector<double> seconds;
    for (int rep = -1; rep < o_.repetitions; ++rep) {  // rep -1 warms up
      const double s = once();
      if (rep >= 0) seconds.push_back(s);
    }
    return summarize(std::move(test), n_tokens, seconds);
  }

  std::string at_depth() const { return o_.n_depth > 0 ? fmt::format(" @ d{}", o_.n_depth) : ""; }

  /// Random tokens, the first of them BOS when the vocabulary adds one.
  std::vector<Token> random_tokens(int n) {
    const Vocab& vocab = m_.vocab();
    std::vector<Token> t(static_cast<size_t>(n));
    for (Token& x : t) x = Token(rng_() % uint32_t(m_.config().n_vocab));
    if (vocab.add_bos() && vocab.bos() >= 0 && n > 0) t[0] = vocab.bos();
    return t;
  }

  /// A pp or tg test's tokens, from the depth on: the cache is cut back to it, and BOS is only at the start.
  std::vector<Token> test_tokens(int n) {
    session_.truncate(o_.n_depth);
    std::vector<Token> tokens = random_tokens(n);
    if (o_.n_depth > 0 && m_.vocab().add_bos()) tokens[0] = Token(rng_() % uint32_t(m_.config().n_vocab));
    return tokens;
  }

  const Model& m_;
  const LoraStack* lora_;
  const BenchOptions& o_;
  kv::PagePool pool_;
  std::mt19937 rng_{1234};
  std::vector<float> logits_;
  Session session_;
};

}  // namespace

void check_bench_options(const BenchOptions& o) {
  if (o.n_prompt == 0 && o.n_gen == 0)
    throw InputError("nothing to measure: -p and -n are both 0",
                     "give -p N for prompt processing, -n N for generation");
  if (!o.parallel.empty() && o.n_gen == 0)
    throw InputError("--parallel measures generation, but -n is 0",
                     "give -n N (tokens each sequence generates)");
}

std::vector<BenchResult> bench(const Model& model, const LoraStack* lora, const kernels::KvLayout& layout,
                               const BenchOptions& o) {
  check_bench_options(o);
  const int n_ctx = model.config().n_ctx_train;
  if (o.n_depth + std::max(o.n_prompt, o.n_gen) > n_ctx || o.parallel_prompt + o.n_gen > n_ctx)
    throw InputError(fmt::format("-d {} with -p {} / -n {} needs more than the model's context of {} tokens",
                                 o.n_depth, o.n_prompt, o.n_gen, n_ctx),
                     "lower -d, -p or -n");
  Bench b(model, lora, layout, o);
  std::vector<BenchResult> results;
  if (o.n_prompt > 0) results.push_back(b.prompt());
  if (o.n_gen > 0) results.push_back(b.generation());
  for (int n_sequences : o.parallel) results.push_back(b.parallel(n_sequences));
  return results;
}

}  // namespace choreo::model
