#pragma once
// Pieces shared by the CLI's subcommands.

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "kernels/backend.h"

namespace choreo::cli {

/// The options every command takes: `--backend cpu|cuda|cuda-emulated` and `--cuda-device N`.
struct BackendChoice {
  std::string name = "cpu";
  int cuda_device = 0;
};
void add_backend_options(CLI::App& app, BackendChoice& choice);
/// The choice engines are opened with (set once, after the command line is parsed).
void set_backend_choice(const BackendChoice& choice);
const BackendChoice& backend_choice();

/// `k=v` pairs from repeated flags (`--input`, `--param`, `--map`); a pair without `=` or a key given twice
/// is a usage error (InputError).
std::map<std::string, std::string> key_values(const std::vector<std::string>& pairs, std::string_view flag);

/// Adds a repeatable `KEY=VALUE` flag (`--input`, `--param`, `--map`): one value per occurrence, all kept;
/// parse the collected values with key_values().
void add_pairs_option(CLI::App& cmd, const std::string& name, std::vector<std::string>& values,
                      const std::string& help);

/// A check that an integer option is at least `min`, with a short message (CLI11's NonNegativeNumber and
/// PositiveNumber print the whole range of a double).
CLI::Validator at_least(long min);

/// Adds `--max-steps` (the work bound of a workflow run or check: loop iterations and calls, dsl/budget.h).
void add_max_steps_option(CLI::App& cmd, int64_t& max_steps);

/// The instance flags of the profilers: `--inputs ROWS.jsonl`, `--limit N`, and the repeatable `--input`,
/// `--map` and `--param` pairs (parse them with key_values()).
void add_instance_options(CLI::App& cmd, std::string& inputs_path, int& limit, std::vector<std::string>& inputs,
                          std::vector<std::string>& maps, std::vector<std::string>& params);

/// Subcommand registration, one per file.
void register_generate(CLI::App& app);
void register_finetune(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_model(CLI::App& app);
void register_bench(CLI::App& app);
void register_exec(CLI::App& app);
void register_run(CLI::App& app);
void register_encode(CLI::App& app);
void register_profile(CLI::App& app);
/// `choreo profile reuse` (cli/cmd_profile_reuse.cc), a subcommand of `profile`.
void register_profile_reuse(CLI::App& profile);
/// `choreo profile quality` (cli/cmd_profile_quality.cc), a subcommand of `profile`.
void register_profile_quality(CLI::App& profile);
void register_check(CLI::App& app);
void register_eval(CLI::App& app);
/// Adds the run form `choreo eval WORKFLOW.yaml --data FILE ...` to the eval group (cli/cmd_eval_run.cc).
void add_eval_run(CLI::App& eval_group);
void register_cache(CLI::App& app);
void register_serve(CLI::App& app);

}  // namespace choreo::cli
