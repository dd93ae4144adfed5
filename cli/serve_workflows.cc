#include "cli/serve_workflows.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include <fmt/ranges.h>

#include "cli/run_output.h"
#include "cli/stream_printer.h"
#include "common/error.h"
#include "dsl/arguments.h"
#include "dsl/workflow_parser.h"
#include "runtime/exec/instances.h"

namespace choreo::cli {

namespace {

using nlohmann::json;
using Emit = std::function<void(std::string)>;

struct Served {
  std::map<std::string, dsl::Workflow> workflows;
  EngineFlags flags;
  std::string model_path;
  std::set<std::string> settable;  // --workflow-params: the params a client may set
};

/// What a client is told of a failed run: an InputError's message and hint at its place in the workflow file,
/// named without the server's directory and without quoting the file (the server's log has the whole error).
std::string client_message(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const InputError& e) {
    std::string where;
    if (!e.where().file.empty()) {
      SourceLocation at = e.where();
      at.file = std::filesystem::path(at.file).filename().string();
      where = at.to_string() + ": ";
    }
    return where + e.message() + (e.hint().empty() ? "" : " (" + e.hint() + ")");
  } catch (...) {
    return "the workflow run failed on the server; its log says why";
  }
}

serve::ApiError bad_body(const std::string& param, const std::string& message) {
  return serve::ApiError(400, "invalid_request_error", "invalid_value", message, param);
}

/// The body's `inputs` or `params`: each a string as it is, any other value as JSON text (as `--inputs`
/// rows).
std::map<std::string, std::string> values(const json& body, const char* key) {
  std::map<std::string, std::string> out;
  const auto it = body.find(key);
  if (it == body.end() || it->is_null()) return out;
  if (!it->is_object()) throw bad_body(key, fmt::format("'{}' must be an object of names and values", key));
  for (const auto& [name, value] : it->items())
    out[name] = value.is_string() ? value.get<std::string>() : value.dump();
  return out;
}

/// A FILE whose writes go to `emit`: StreamPrinter, which `choreo run` prints with, writes to a FILE.
std::unique_ptr<FILE, int (*)(FILE*)> emitting_file(const Emit* emit) {
  cookie_io_functions_t io{};
  io.write = [](void* cookie, const char* bytes, size_t n) -> ssize_t {
    (*static_cast<const Emit*>(cookie))(std::string(bytes, n));
    return ssize_t(n);
  };
  FILE* f = fopencookie(const_cast<Emit*>(emit), "w", io);
  if (!f) throw RuntimeFailure("cannot open a stream for a workflow's text");
  return {f, &std::fclose};
}

nlohmann::ordered_json run(const Served& served, const std::string& name, const json& body,
                           runtime::Engine& engine, const std::function<void()>& started, const Emit& emit,
                           const std::function<bool()>& cancelled) {
  const auto found = served.workflows.find(name);
  if (found == served.workflows.end()) {
    std::string names;
    for (const auto& [n, w] : served.workflows) names += (names.empty() ? "" : ", ") + n;
    throw serve::ApiError(404, "invalid_request_error", "workflow_not_found",
                          fmt::format("no workflow '{}' on this server; it runs: {}", name, names));
  }
  for (const auto& [key, value] : body.items())
    if (key != "inputs" && key != "params" && key != "stream")
      throw bad_body(key,
                     fmt::format("unknown field '{}': a workflow run takes inputs, params and stream", key));
  const dsl::Workflow& workflow = found->second;
  exec::RunArguments arguments;
  arguments.inputs = values(body, "inputs");
  arguments.params = values(body, "params");
  // A param the workflow declares is set only when --workflow-params allows it; a name it does not declare is
  // left to the run, whose error suggests the nearest one.
  for (const auto& entry : arguments.params)
    if (!served.settable.count(entry.first) &&
        std::any_of(workflow.params.begin(), workflow.params.end(),
                    [&](const dsl::Param& p) { return p.name.value == entry.first; }))
      throw bad_body("params." + entry.first,
                     fmt::format("clients may not set param '{}' on this server (it sets the params a client may "
                                 "with --workflow-params NAME,...; it allows: {})",
                                 entry.first, served.settable.empty() ? std::string("none")
                                                                      : fmt::format("{}", fmt::join(served.settable, ", "))));
  // Every input is given and known before the run starts (a run finds a missing one only when it needs it).
  for (const dsl::Input& input : workflow.inputs)
    if (!arguments.inputs.count(input.name.value))
      throw bad_body("inputs." + input.name.value,
                     fmt::format("workflow '{}' needs input '{}' ({})", name, input.name.value,
                                 dsl::value_type_name(input.type)));
  for (const auto& entry : arguments.inputs) {
    const std::string& given = entry.first;  // a reference the lambda can capture (clang refuses a binding)
    if (std::none_of(workflow.inputs.begin(), workflow.inputs.end(),
                     [&](const dsl::Input& i) { return i.name.value == given; }))
      throw bad_body("inputs." + given, fmt::format("workflow '{}' has no input '{}'", name, given));
  }

  std::vector<exec::InstanceOutcome> outcomes;
  {
    const auto out = emitting_file(&emit);
    StreamPrinter printer(
        engine.model().vocab(), [](const std::string&) { return std::string(); }, out.get());
    exec::RunHooks hooks;
    hooks.on_plan = [&](const dsl::plan::Plan&) { started(); };
    hooks.on_decode_start = [&](const std::vector<exec::DecodeBranch>& b) { printer.start(b); };
    hooks.on_token = [&](size_t branch, model::Token t) { printer.token(branch, t); };
    hooks.on_decoded = [&](const exec::MessageRecord& m) { printer.finished(m); };
    hooks.cancelled = cancelled;
    exec::InstancesOptions options;
    options.hooks = [&](size_t) { return hooks; };
    outcomes = exec::run_instances(workflow, engine, {arguments}, options);
  }
  if (const std::exception_ptr error = outcomes.at(0).error) {
    try {
      std::rethrow_exception(error);
    } catch (const exec::RunCancelled&) {
      throw;
    } catch (...) {
    }
    std::fprintf(stderr, "serve: workflow %s failed: %s", name.c_str(), describe_error(error).c_str());
    if (is_input_error(error))
      throw serve::ApiError(400, "invalid_request_error", "invalid_workflow_input", client_message(error));
    throw serve::ApiError(500, "server_error", "workflow_failed", client_message(error));
  }
  if (workflow.output) emit(output_block(outcomes[0].result.output));
  return run_document(workflow, "choreo", false, served.flags.tiers_json(engine.tier_stats()),
                      served.model_path, {}, outcomes);
}

}  // namespace

serve::WorkflowRunner served_workflows(const std::string& dir, const EngineFlags& flags,
                                       const std::string& model_path, const std::vector<std::string>& settable) {
  auto served = std::make_shared<Served>();
  served->flags = flags;
  served->model_path = model_path;
  served->settable.insert(settable.begin(), settable.end());
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw InputError(fmt::format("--workflows {}: not a directory", dir),
                     "give a directory of workflow YAML files");
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::filesystem::path& path = entry.path();
    if (!entry.is_regular_file() || (path.extension() != ".yaml" && path.extension() != ".yml")) continue;
    dsl::Workflow workflow = dsl::load_workflow(path.string());
    if (!workflow.models.empty())
      throw InputError(
          fmt::format("--workflows: {} declares models:, which choreo serve does not run yet", path.string()),
          "serve the extra models with --lora-modules or --model-file, and leave this workflow out");
    served->workflows.emplace(path.stem().string(), std::move(workflow));
  }
  if (served->workflows.empty())
    throw InputError(fmt::format("--workflows {}: no workflow files (*.yaml, *.yml) in it", dir));
  serve::WorkflowRunner runner;
  for (const auto& [name, w] : served->workflows) runner.names.push_back(name);
  for (const std::string& param : served->settable)
    if (std::none_of(served->workflows.begin(), served->workflows.end(), [&](const auto& w) {
          return std::any_of(w.second.params.begin(), w.second.params.end(),
                             [&](const auto& p) { return p.name.value == param; });
        }))
      throw InputError(fmt::format("--workflow-params: no workflow in {} declares a param '{}'", dir, param),
                       "name params the workflows declare under params:");
  runner.run = [served](const std::string& name, const json& body, runtime::Engine& engine,
                        const std::function<void()>& started, const Emit& emit,
                        const std::function<bool()>& cancelled) {
    return run(*served, name, body, engine, started, emit, cancelled);
  };
  return runner;
}

}  // namespace choreo::cli
