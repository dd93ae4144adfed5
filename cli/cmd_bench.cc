// `choreo bench`: prompt-processing and generation speed, measured like llama-bench (runtime/model/bench.h),
// printed as llama-bench's table or as JSON.

#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "cli/engine_flags.h"
#include "runtime/model/bench.h"

namespace choreo::cli {

namespace {

struct BenchOptions {
  model::BenchOptions bench;
  EngineFlags engine;
  bool json = false;
};

/// What the table and the JSON say about the model and where it ran.
struct BenchSetting {
  const gguf::File& file;
  int64_t n_params;
  std::string backend;
  int threads;
};

void print_json(const BenchOptions& o, const BenchSetting& s,
                const std::vector<model::BenchResult>& results) {
  nlohmann::json out = nlohmann::json::array();
  for (const model::BenchResult& r : results)
    out.push_back({{"model", s.file.path()},
                   {"size_bytes", s.file.file_size()},
                   {"n_params", s.n_params},
                   {"backend", s.backend},
                   {"threads", s.threads},
                   {"type_k", o.engine.type_k},
                   {"type_v", o.engine.type_v},
                   {"n_depth", o.bench.n_depth},
                   {"test", r.test},
                   {"avg_ts", r.mean_tokens_per_s},
                   {"stddev_ts", r.stddev_tokens_per_s},
                   {"samples_ts", r.samples_tokens_per_s}});
  std::printf("%s\n", out.dump(2).c_str());
}

void print_table(const BenchSetting& s, const std::vector<model::BenchResult>& results) {
  std::printf("| %-40s | %10s | %8s | %7s | %7s | %8s | %20s |\n", "model", "size", "params", "backend", "threads",
              "test", "t/s");
  std::printf("|%s|%s|%s|%s|%s|%s|%s|\n", std::string(42, '-').c_str(), std::string(12, '-').c_str(),
              std::string(10, '-').c_str(), std::string(9, '-').c_str(), std::string(9, '-').c_str(),
              std::string(10, '-').c_str(), std::string(22, '-').c_str());
  const std::string name = s.file.path().substr(s.file.path().find_last_of('/') + 1);
  for (const model::BenchResult& r : results)
    std::printf("| %-40s | %6.2f MiB | %6.1f M | %7s | %7d | %8s | %12.2f ± %5.2f |\n", name.c_str(),
                s.file.file_size() / 1048576.0, s.n_params / 1e6, s.backend.c_str(), s.threads,
                r.test.c_str(), r.mean_tokens_per_s, r.stddev_tokens_per_s);
}

void run_bench(const BenchOptions& o) {
  model::check_bench_options(o.bench);
  const std::shared_ptr<runtime::LoadedModels> loaded = runtime::load_models(o.engine.model_options());
  const model::Model& m = loaded->model();
  const std::vector<model::BenchResult> results =
      model::bench(m, &loaded->base_lora, o.engine.kv_layout(m), o.bench);
  int64_t n_params = 0;
  for (const auto& t : m.file().tensors()) n_params += t.n_elements();
  const BenchSetting setting{m.file(), n_params, loaded->backend->name(), loaded->backend->threads()};
  if (o.json)
    print_json(o, setting, results);
  else
    print_table(setting, results);
}

}  // namespace

void register_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench", "measure prompt processing (pp) and generation (tg) speed");
  cmd->add_option("-p,--n-prompt", o->bench.n_prompt, "prompt tokens (0 = skip)")->check(at_least(0));
  cmd->add_option("-n,--n-gen", o->bench.n_gen, "generated tokens (0 = skip)")->check(at_least(0));
  cmd->add_option("-r,--repetitions", o->bench.repetitions, "repetitions")->check(at_least(1));
  cmd->add_option("-b,--batch-size", o->bench.max_batch, "micro-batch size for prompt processing")
      ->check(at_least(1));
  cmd->add_option("-d,--n-depth", o->bench.n_depth,
                  "tokens already in the KV cache when each test starts (llama-bench -d)")
      ->check(at_least(0));
  cmd->add_option("--parallel", o->bench.parallel,
                  "also measure decode throughput of B sequences decoded together, for each B given "
                  "(e.g. --parallel 1,2,4,8,16)")
      ->delimiter(',')
      ->check(CLI::Range(1, 256));
  cmd->add_option("--parallel-prompt", o->bench.parallel_prompt,
                  "prompt tokens of each --parallel sequence (default 128)")
      ->check(at_least(0));
  o->engine.add(*cmd, EngineFlags::kModel | EngineFlags::kLora | EngineFlags::kKv);
  cmd->add_flag("--json", o->json, "print JSON instead of a table");
  cmd->callback([o] { run_bench(*o); });
}

}  // namespace choreo::cli
