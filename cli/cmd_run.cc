// `choreo run`: runs a workflow file once (docs/workflow-language.md, "Running"). Prints each decode's text
// as its batch finishes, then the workflow's output; `--json` writes every message with its timings.

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "dsl/workflow_parser.h"
#include "runtime/common/error.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/interpreter.h"
#include "runtime/kv/page_pool.h"

namespace choreo::cli {

namespace {

struct RunOptions {
  std::string workflow_path, model_path, mode = "choreo", json_path;
  std::vector<std::string> inputs, params;
  int n_threads = 0;
  int cache_mib = 4096;
  int page_tokens = 32;
};

/// `k=v` pairs from repeated flags; a pair without `=` or given twice is a usage error.
std::map<std::string, std::string> key_values(const std::vector<std::string>& pairs, std::string_view flag) {
  std::map<std::string, std::string> out;
  for (const std::string& pair : pairs) {
    const size_t eq = pair.find('=');
    if (eq == std::string::npos || eq == 0)
      throw InputError(fmt::format("{} '{}' is not KEY=VALUE", flag, pair),
                       fmt::format("write e.g. {} question='What is 2+2?'", flag));
    if (!out.emplace(pair.substr(0, eq), pair.substr(eq + 1)).second)
      throw InputError(fmt::format("{} {} is given twice", flag, pair.substr(0, eq)));
  }
  return out;
}

/// -m wins; else the workflow's `model:` when it names an existing file (as given, or next to the workflow);
/// else the default model.
std::string resolve_model(const RunOptions& o, const dsl::Workflow& workflow) {
  if (!o.model_path.empty() || !workflow.model) return o.model_path;
  const std::filesystem::path named = workflow.model->value;
  if (std::filesystem::exists(named)) return named.string();
  const std::filesystem::path beside = std::filesystem::path(o.workflow_path).parent_path() / named;
  if (std::filesystem::exists(beside)) return beside.string();
  throw InputError(fmt::format("the workflow's model '{}' is not a file", workflow.model->value),
                   "pass the model's path with -m", workflow.model->where,
                   workflow.source_line(workflow.model->where.line));
}

/// ANSI colour of an agent: its declared `color:` when it is a named colour, else one picked by its name.
std::string agent_colour(const dsl::Workflow& workflow, const std::string& agent) {
  static const std::map<std::string, std::string> named = {
      {"black", "30"},   {"red", "31"},  {"green", "32"}, {"yellow", "33"}, {"blue", "34"},
      {"magenta", "35"}, {"cyan", "36"}, {"white", "37"}, {"gray", "90"}};
  for (const dsl::Agent& a : workflow.agents) {
    if (a.name.value != agent || !a.color) continue;
    auto it = named.find(a.color->value);
    if (it != named.end()) return it->second;
    const std::string& hex = a.color->value;  // #rrggbb, checked by the parser
    if (hex.size() == 7 && hex[0] == '#')
      return fmt::format("38;2;{};{};{}", std::stoi(hex.substr(1, 2), nullptr, 16),
                         std::stoi(hex.substr(3, 2), nullptr, 16), std::stoi(hex.substr(5, 2), nullptr, 16));
  }
  static const char* palette[] = {"36", "33", "35", "32", "34", "31"};
  return palette[std::hash<std::string>{}(agent) % 6];
}

void print_decode(const dsl::Workflow& workflow, const exec::MessageRecord& m, bool colour) {
  const std::string who = m.agent.empty() ? m.name : fmt::format("{} ({})", m.name, m.agent);
  if (colour)
    std::cout << fmt::format("\033[1;{}m── {}\033[0m\n", agent_colour(workflow, m.agent), who);
  else
    std::cout << fmt::format("── {}\n", who);
  std::cout << m.text << "\n\n" << std::flush;
}

nlohmann::ordered_json to_json(const exec::RunResult& r, const dsl::Workflow& workflow,
                               const std::string& mode, const std::string& model_path) {
  nlohmann::ordered_json j;
  j["workflow"] = workflow.name.value;
  j["model"] = model_path;
  j["mode"] = mode;
  j["messages"] = nlohmann::ordered_json::array();
  for (const exec::MessageRecord& m : r.messages) {
    nlohmann::ordered_json e;
    e["name"] = m.name;
    e["kind"] = m.kind;
    e["id"] = m.id;
    e["agent"] = m.agent;
    e["private"] = m.is_private;
    e["parents"] = m.parents;
    e["text"] = m.text;
    if (m.kind == "decode") {
      e["stop_reason"] = m.stop_reason;
      e["n_generated"] = m.n_generated;
    }
    e["tokens"] = m.tokens;
    e["start_pos"] = m.start_pos;
    e["n_computed"] = m.n_computed;
    e["n_reused"] = m.n_reused;
    e["ttft_ms"] = m.ttft_ms;
    e["total_ms"] = m.total_ms;
    j["messages"].push_back(e);
  }
  j["batches"] = nlohmann::ordered_json::array();
  for (const exec::BatchRecord& b : r.batches) j["batches"].push_back({{"kind", b.kind}, {"size", b.size}});
  j["output"] = r.output;
  return j;
}

void run_run(const RunOptions& o) {
  const runtime::Mode mode = runtime::parse_mode(o.mode);
  exec::RunArguments arguments{key_values(o.inputs, "--input"), key_values(o.params, "--param")};
  const dsl::Workflow workflow = dsl::load_workflow(o.workflow_path);
  std::ofstream json_file;
  if (!o.json_path.empty()) {
    json_file.open(o.json_path, std::ios::binary);
    if (!json_file) throw InputError(fmt::format("cannot write '{}'", o.json_path), "check the --json path");
  }
  LoadedModel lm = load_model(resolve_model(o, workflow), o.n_threads);
  kv::PagePool pool(lm.model->kv_layout(o.page_tokens), size_t(o.cache_mib) << 20);
  runtime::Engine engine(*lm.model, pool, mode);

  const bool colour = isatty(STDOUT_FILENO) != 0;
  exec::RunHooks hooks;
  hooks.on_decoded = [&](const exec::MessageRecord& m) { print_decode(workflow, m, colour); };
  const exec::RunResult result = exec::run_workflow(workflow, engine, arguments, hooks);
  if (workflow.output) {
    std::cout << (colour ? "\033[1m── output\033[0m\n" : "── output\n") << result.output << "\n"
              << std::flush;
  }
  if (json_file.is_open()) {
    json_file << to_json(result, workflow, o.mode, lm.model->file().path())
                     .dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
              << '\n';
    if (!json_file) throw RuntimeFailure(fmt::format("writing '{}' failed", o.json_path));
  }
}

}  // namespace

void register_run(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "run a workflow file once (see docs/workflow-language.md)");
  cmd->add_option("workflow", o->workflow_path, "workflow YAML file")->required();
  add_model_options(*cmd, o->model_path, o->n_threads);
  cmd->add_option("--input", o->inputs, "an input value, KEY=VALUE (repeatable)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--param", o->params, "override a param, KEY=VALUE (repeatable)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--mode", o->mode,
                  "engine path: choreo (default; reuse cached parents), prefix or naive (chat-API baselines)")
      ->check(CLI::IsMember({"choreo", "prefix", "naive"}));
  cmd->add_option("--json", o->json_path,
                  "write every message (text, parents, tokens, timings) as JSON here");
  cmd->add_option("--cache-mib", o->cache_mib, "KV page pool budget in MiB (default 4096)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--page-tokens", o->page_tokens, "tokens per KV page (default 32)")
      ->check(CLI::Range(1, 4096));
  cmd->callback([o] { run_run(*o); });
}

}  // namespace choreo::cli
