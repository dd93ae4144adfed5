// `choreo bench`: prompt-processing and generation speed, measured like llama-bench (random tokens,
// empty cache per repetition, mean ± standard deviation over repetitions). With -d, every test starts
// from a cache that already holds that many tokens (llama-bench -d); the depth is encoded once, untimed,
// and cut back to after each repetition. --parallel measures decode throughput of B sequences decoded
// together in one batch (as llama.cpp's batched-bench: each first gets --parallel-prompt tokens, untimed).

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "cli/engine_flags.h"
#include "common/error.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/session.h"

namespace choreo::cli {

namespace {

struct BenchOptions {
  int n_prompt = 512, n_gen = 128, reps = 5, batch = 512, n_depth = 0, parallel_prompt = 128;
  std::vector<int> parallel;
  EngineFlags engine;
  bool json = false;
};

struct Result {
  std::string test;
  double mean_tps = 0, stddev_tps = 0;
  std::vector<double> samples;
};

Result summarize(std::string test, int n_tokens, const std::vector<double>& seconds) {
  Result r;
  r.test = std::move(test);
  for (double s : seconds) r.samples.push_back(n_tokens / s);
  for (double t : r.samples) r.mean_tps += t;
  r.mean_tps /= r.samples.size();
  for (double t : r.samples) r.stddev_tps += (t - r.mean_tps) * (t - r.mean_tps);
  r.stddev_tps = r.samples.size() > 1 ? std::sqrt(r.stddev_tps / (r.samples.size() - 1)) : 0.0;
  return r;
}

void run_bench(const BenchOptions& o) {
  if (o.n_prompt == 0 && o.n_gen == 0)
    throw InputError("nothing to measure: -p and -n are both 0", "give -p N for prompt processing, -n N for generation");
  if (!o.parallel.empty() && o.n_gen == 0)
    throw InputError("--parallel measures generation, but -n is 0", "give -n N (tokens each sequence generates)");
  const std::shared_ptr<runtime::LoadedModels> loaded = runtime::load_models(o.engine.model_options());
  const model::LoraStack* lora = &loaded->base_lora;
  const model::Model& m = loaded->model();
  const model::Vocab& vocab = m.vocab();
  const int n_vocab = m.config().n_vocab;
  const int n_ctx = m.config().n_ctx_train;
  if (o.n_depth + std::max(o.n_prompt, o.n_gen) > n_ctx || o.parallel_prompt + o.n_gen > n_ctx)
    throw InputError(fmt::format("-d {} with -p {} / -n {} needs more than the model's context of {} tokens",
                                 o.n_depth, o.n_prompt, o.n_gen, n_ctx),
                     "lower -d, -p or -n");
  kv::PagePool pool(m.backend(), o.engine.kv_layout(m), kv::budget_within_device(m.backend(), size_t(8) << 30));
  std::mt19937 rng(1234);
  auto random_tokens = [&](int n) {
    std::vector<model::Token> t(n);
    for (auto& x : t) x = model::Token(rng() % n_vocab);
    if (vocab.add_bos() && vocab.bos() >= 0 && n > 0) t[0] = vocab.bos();
    return t;
  };
  using clock = std::chrono::steady_clock;
  std::vector<float> logits;
  std::vector<Result> results;

  // The tests' starting cache: empty, or o.n_depth tokens encoded once (untimed).
  model::Session s(m, pool, o.batch);
  s.set_lora(lora);
  if (o.n_depth > 0) s.eval(random_tokens(o.n_depth), &logits);
  const std::string at_depth = o.n_depth > 0 ? fmt::format(" @ d{}", o.n_depth) : "";
  if (o.n_prompt > 0) {
    std::vector<double> secs;
    for (int rep = -1; rep < o.reps; ++rep) {  // rep -1 warms up
      s.truncate(o.n_depth);
      std::vector<model::Token> toks = random_tokens(o.n_prompt);
      if (o.n_depth > 0 && vocab.add_bos()) toks[0] = model::Token(rng() % n_vocab);  // BOS only at the start
      auto t0 = clock::now();
      s.eval(toks, &logits);
      double dt = std::chrono::duration<double>(clock::now() - t0).count();
      if (rep >= 0) secs.push_back(dt);
    }
    results.push_back(summarize(fmt::format("pp{}{}", o.n_prompt, at_depth), o.n_prompt, secs));
  }
  if (o.n_gen > 0) {
    std::vector<double> secs;
    for (int rep = -1; rep < o.reps; ++rep) {
      s.truncate(o.n_depth);
      std::vector<model::Token> toks = random_tokens(o.n_gen);
      if (o.n_depth > 0 && vocab.add_bos()) toks[0] = model::Token(rng() % n_vocab);
      auto t0 = clock::now();
      for (int i = 0; i < o.n_gen; ++i) s.eval(std::span<const model::Token>(&toks[i], 1), &logits);
      double dt = std::chrono::duration<double>(clock::now() - t0).count();
      if (rep >= 0) secs.push_back(dt);
    }
    results.push_back(summarize(fmt::format("tg{}{}", o.n_gen, at_depth), o.n_gen, secs));
  }
  for (int b : o.parallel) {
    // B sequences, each with its own parallel_prompt tokens (untimed), then n_gen decode steps of all B
    // together; the rate counts every sequence's tokens.
    std::vector<double> secs;
    for (int rep = -1; rep < o.reps; ++rep) {
      std::vector<std::unique_ptr<model::Session>> owned;
      std::vector<model::Session*> seqs;
      for (int i = 0; i < b; ++i) {
        owned.push_back(std::make_unique<model::Session>(m, pool, o.batch));
        owned.back()->set_lora(lora);
        seqs.push_back(owned.back().get());
        if (o.parallel_prompt > 0) seqs.back()->eval(random_tokens(o.parallel_prompt), &logits);
      }
      std::vector<model::Token> step(static_cast<size_t>(b), 0);
      auto t0 = clock::now();
      for (int i = 0; i < o.n_gen; ++i) {
        for (auto& t : step) t = model::Token(rng() % n_vocab);
        model::Session::decode_together(seqs, step, &logits);
      }
      double dt = std::chrono::duration<double>(clock::now() - t0).count();
      if (rep >= 0) secs.push_back(dt);
    }
    results.push_back(summarize(fmt::format("tg{} x{}", o.n_gen, b), o.n_gen * b, secs));
  }

  const auto& f = m.file();
  int64_t n_params = 0;
  for (const auto& t : f.tensors()) n_params += t.n_elements();
  if (o.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const Result& r : results)
      out.push_back({{"model", f.path()}, {"size_bytes", f.file_size()}, {"n_params", n_params},
                     {"backend", loaded->backend->name()}, {"threads", loaded->backend->threads()},
                     {"type_k", o.engine.type_k}, {"type_v", o.engine.type_v}, {"n_depth", o.n_depth}, {"test", r.test},
                     {"avg_ts", r.mean_tps}, {"stddev_ts", r.stddev_tps}, {"samples_ts", r.samples}});
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }
  std::printf("| %-40s | %10s | %8s | %7s | %7s | %8s | %20s |\n", "model", "size", "params", "backend", "threads",
              "test", "t/s");
  std::printf("|%s|%s|%s|%s|%s|%s|%s|\n", std::string(42, '-').c_str(), std::string(12, '-').c_str(),
              std::string(10, '-').c_str(), std::string(9, '-').c_str(), std::string(9, '-').c_str(),
              std::string(10, '-').c_str(), std::string(22, '-').c_str());
  std::string name = f.path().substr(f.path().find_last_of('/') + 1);
  for (const Result& r : results)
    std::printf("| %-40s | %6.2f MiB | %6.1f M | %7s | %7d | %8s | %12.2f ± %5.2f |\n", name.c_str(),
                f.file_size() / 1048576.0, n_params / 1e6, loaded->backend->name().c_str(), loaded->backend->threads(),
                r.test.c_str(), r.mean_tps, r.stddev_tps);
}

}  // namespace

void register_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench", "measure prompt processing (pp) and generation (tg) speed");
  cmd->add_option("-p,--n-prompt", o->n_prompt, "prompt tokens (0 = skip)")->check(at_least(0));
  cmd->add_option("-n,--n-gen", o->n_gen, "generated tokens (0 = skip)")->check(at_least(0));
  cmd->add_option("-r,--repetitions", o->reps, "repetitions")->check(at_least(1));
  cmd->add_option("-b,--batch-size", o->batch, "micro-batch size for prompt processing")->check(at_least(1));
  cmd->add_option("-d,--n-depth", o->n_depth, "tokens already in the KV cache when each test starts (llama-bench -d)")
      ->check(at_least(0));
  cmd->add_option("--parallel", o->parallel,
                  "also measure decode throughput of B sequences decoded together, for each B given "
                  "(e.g. --parallel 1,2,4,8,16)")
      ->delimiter(',')
      ->check(CLI::Range(1, 256));
  cmd->add_option("--parallel-prompt", o->parallel_prompt, "prompt tokens of each --parallel sequence (default 128)")
      ->check(at_least(0));
  o->engine.add(*cmd, EngineFlags::kModel | EngineFlags::kLora | EngineFlags::kKv);
  cmd->add_flag("--json", o->json, "print JSON instead of a table");
  cmd->callback([o] { run_bench(*o); });
}

}  // namespace choreo::cli
