#include "runtime/exec/instances.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/input_file.h"
#include "runtime/exec/json_line.h"
#include "runtime/exec/leak_guard.h"
#include "runtime/exec/scheduler.h"

namespace choreo::exec {

std::vector<InputRow> read_input_rows(const std::string& path, const dsl::Workflow& workflow,
                                      const RunArguments& base, const std::map<std::string, std::string>& fields) {
  for (const auto& [input, field] : fields)
    if (std::none_of(workflow.inputs.begin(), workflow.inputs.end(),
                     [&, &name = input](const dsl::Input& i) { return i.name.value == name; }))
      throw InputError(fmt::format("--map {}={}: workflow `{}` has no input `{}`", input, field, workflow.name.value,
                                   input),
                       "write --map INPUT=FIELD with one of the workflow's inputs");
  LineReader reader(path, "inputs file");
  std::vector<InputRow> rows;
  std::string line;
  while (reader.next(line)) {
    const int number = reader.line_number();
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    // The same reading as every other JSON-lines input (exec calls, eval data and results).
    const JsonLine parsed = parse_json_line(number, line);
    if (!parsed.json_error.empty())
      throw InputError(fmt::format("line {} is not valid JSON: {}", number, parsed.json_error),
                       "write one JSON object per line, e.g. {\"problem\": \"What is 2+2?\"}",
                       SourceLocation{path, number, parsed.json_error_column()}, line);
    const nlohmann::json& row = parsed.value;
    if (!row.is_object())
      throw InputError(fmt::format("line {} is a JSON {}, not an object", number, row.type_name()),
                       "write one JSON object per line", SourceLocation{path, number, 1}, line);
    InputRow r{number, base};
    for (const dsl::Input& input : workflow.inputs) {
      auto mapped = fields.find(input.name.value);
      const std::string& key = mapped == fields.end() ? input.name.value : mapped->second;
      auto it = row.find(key);
      if (it == row.end()) continue;
      r.arguments.inputs[input.name.value] = it->is_string() ? it->get<std::string>() : it->dump();
    }
    for (const dsl::Input& input : workflow.inputs)
      if (!r.arguments.inputs.count(input.name.value))
        throw InputError(fmt::format("line {} has no `{}`, for input `{}` of workflow `{}`", number,
                                     fields.count(input.name.value) ? fields.at(input.name.value) : input.name.value,
                                     input.name.value, workflow.name.value),
                         fmt::format("add \"{}\" to every row, or give it to all rows with --input {}=VALUE",
                                     input.name.value, input.name.value),
                         SourceLocation{path, number, 1}, line);
    rows.push_back(std::move(r));
  }
  if (rows.empty())
    throw InputError(fmt::format("inputs file '{}' has no rows", path), "write one JSON object per line");
  return rows;
}

std::vector<InputRow> instance_rows(const dsl::Workflow& workflow, const std::string& path, const RunArguments& base,
                                    const std::map<std::string, std::string>& fields, int limit) {
  std::vector<InputRow> rows;
  if (path.empty())
    rows.push_back({0, base});
  else
    rows = read_input_rows(path, workflow, base, fields);
  if (limit > 0 && int(rows.size()) > limit) rows.resize(size_t(limit));
  return rows;
}

std::vector<InstanceOutcome> run_instances(const dsl::Workflow& workflow, runtime::Engine& engine,
                                           const std::vector<RunArguments>& arguments,
                                           const InstancesOptions& options) {
  std::vector<InstanceOutcome> outcomes(arguments.size());
  std::optional<LeakGuard> guard;
  if (options.no_leak) guard.emplace(engine);
  BatchScheduler scheduler(engine, guard ? &*guard : nullptr);
  const std::vector<std::exception_ptr> errors =
      scheduler.run(arguments.size(), options.concurrency, [&](size_t i, CallSink& sink) {
        RunHooks hooks = options.hooks ? options.hooks(i) : RunHooks{};
        hooks.on_failure = [&outcomes, i](RunResult&& partial) { outcomes[i].result = std::move(partial); };
        outcomes[i].result = run_workflow(workflow, sink, arguments[i], hooks);
      });
  for (size_t i = 0; i < errors.size(); ++i) outcomes[i].error = errors[i];
  return outcomes;
}

}  // namespace choreo::exec
