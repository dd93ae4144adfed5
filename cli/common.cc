#include "cli/common.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "dsl/budget.h"
#include "common/error.h"
#include "common/paths.h"
#include "runtime/kv/tier_config.h"

namespace choreo::cli {

namespace {
BackendChoice& choice() {
  static BackendChoice value;
  return value;
}
}  // namespace

const BackendChoice& backend_choice() { return choice(); }

void add_backend_options(CLI::App& app, BackendChoice& choice) {
  app.add_option("--backend", choice.name,
                 "where the model runs: cpu (default); cuda (an NVIDIA GPU: built when nvcc is found, never run on a "
                 "GPU yet, see docs/cuda.md); cuda-emulated (the CUDA kernels on the CPU through the block emulator, "
                 "every launch checked: slow, for checking)")
      ->check(CLI::IsMember({"cpu", "cuda", "cuda-emulated"}));
  app.add_option("--cuda-device", choice.cuda_device, "the GPU --backend cuda uses (default 0)")
      ->check(at_least(0));
}

void set_backend_choice(const BackendChoice& value) { choice() = value; }

std::map<std::string, std::string> key_values(const std::vector<std::string>& pairs, std::string_view flag) {
  std::map<std::string, std::string> out;
  for (const std::string& pair : pairs) {
    const size_t eq = pair.find('=');
    if (eq == std::string::npos || eq == 0)
      throw InputError(fmt::format("{} '{}' is not KEY=VALUE", flag, pair),
                       fmt::format("write e.g. {} name=value", flag));
    if (!out.emplace(pair.substr(0, eq), pair.substr(eq + 1)).second)
      throw InputError(fmt::format("{} {} is given twice", flag, pair.substr(0, eq)));
  }
  return out;
}

void add_pairs_option(CLI::App& cmd, const std::string& name, std::vector<std::string>& values,
                      const std::string& help) {
  cmd.add_option(name, values, help)->expected(1)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

CLI::Validator at_least(long min) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        long value = 0;
        if (!CLI::detail::lexical_cast(text, value)) return fmt::format("'{}' is not a whole number", text);
        if (value < min) return fmt::format("must be at least {}, not {}", min, value);
        return {};
      },
      fmt::format("INT>={}", min));
}

void add_instance_options(CLI::App& cmd, std::string& inputs_path, int& limit, std::vector<std::string>& inputs,
                          std::vector<std::string>& maps, std::vector<std::string>& params) {
  cmd.add_option("--inputs", inputs_path, "JSON Lines file, one instance per line (as for choreo run)");
  cmd.add_option("--limit", limit, "instances to run from --inputs (default 10; 0 = all)")->check(at_least(0));
  add_pairs_option(cmd, "--input", inputs, "an input value for every instance, KEY=VALUE (repeatable)");
  add_pairs_option(cmd, "--map", maps, "with --inputs: read input INPUT from row key FIELD, INPUT=FIELD (repeatable)");
  add_pairs_option(cmd, "--param", params, "override a param, KEY=VALUE (repeatable)");
}

void add_max_steps_option(CLI::App& cmd, int64_t& max_steps) {
  cmd.add_option("--max-steps", max_steps,
                 fmt::format("work bound of the workflow: loop iterations and calls it may take (default {})",
                             dsl::kDefaultMaxSteps))
      ->check(at_least(1));
}

}  // namespace choreo::cli
