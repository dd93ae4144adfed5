#include "runtime/exec/profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "common/atomic_file.h"
#include "common/error.h"
#include "runtime/exec/workflow_models.h"

namespace choreo::exec {

namespace {

/// Splits `answer[1][2]` into its base and index texts.
std::vector<std::string> name_parts(const std::string& name) {
  std::vector<std::string> parts;
  const size_t bracket = name.find('[');
  parts.push_back(name.substr(0, bracket));
  for (size_t at = bracket; at != std::string::npos && at < name.size();) {
    const size_t close = name.find(']', at);
    if (close == std::string::npos) break;
    parts.push_back(name.substr(at + 1, close - at - 1));
    at = name.find('[', close);
  }
  return parts;
}

/// The label of a batch: the common name with indices that differ between its members replaced by `*`.
std::string batch_label(const std::vector<const MessageRecord*>& members) {
  std::vector<std::string> label = name_parts(members.front()->name);
  for (const MessageRecord* m : members) {
    const std::vector<std::string> parts = name_parts(m->name);
    for (size_t i = 1; i < label.size(); ++i)
      if (i >= parts.size() || parts[i] != label[i]) label[i] = "*";
  }
  std::string out = label[0];
  for (size_t i = 1; i < label.size(); ++i) out += "[" + label[i] + "]";
  return out;
}

nlohmann::ordered_json timing_json(const RunTiming& t) {
  nlohmann::ordered_json steps = nlohmann::ordered_json::array();
  for (const StepTiming& s : t.steps)
    steps.push_back({{"step", s.label},
                     {"size", s.size},
                     {"ttft_ms", s.ttft_ms},
                     {"total_ms", s.total_ms},
                     {"computed", s.n_computed},
                     {"reused", s.n_reused},
                     {"generated", s.n_generated}});
  return {{"ttft_ms", t.ttft_ms}, {"e2e_ms", t.e2e_ms},         {"computed", t.n_computed},
          {"reused", t.n_reused}, {"generated", t.n_generated}, {"steps", steps}};
}

nlohmann::ordered_json instances_json(const std::vector<ProfiledRow>& instances) {
  nlohmann::ordered_json raw = nlohmann::ordered_json::array();
  for (const ProfiledRow& row : instances)
    raw.push_back({{"line", row.line},
                   {"baseline", timing_json(row.runs.baseline_timing)},
                   {"choreo", timing_json(row.runs.choreo_timing)},
                   {"unforced_decodes", row.runs.n_unforced},
                   {"baseline_output", row.runs.baseline.output},
                   {"choreo_output", row.runs.choreo.output}});
  return raw;
}

void write_json(const std::string& path, const nlohmann::ordered_json& doc) {
  write_file_atomically(path, doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

/// Adds an instance's decode steps to the per-step sums: the k-th step labelled L of the baseline run is
/// matched with the k-th step labelled L of the choreo run (and summed as `L #k` when k > 1).
void add_steps(std::vector<StepSummary>& steps, const RunTiming& b, const RunTiming& c) {
  std::map<std::string, int> seen;
  for (const StepTiming& bs : b.steps) {
    const int occurrence = seen[bs.label]++;
    int found = -1;
    for (size_t k = 0, count = 0; k < c.steps.size(); ++k)
      if (c.steps[k].label == bs.label && int(count++) == occurrence) found = int(k);
    if (found < 0) continue;
    const StepTiming& cs = c.steps[size_t(found)];
    const std::string label = bs.label + (occurrence ? fmt::format(" #{}", occurrence + 1) : "");
    auto it =
        std::find_if(steps.begin(), steps.end(), [&](const StepSummary& s) { return s.label == label; });
    if (it == steps.end()) {
      steps.push_back({label});
      it = steps.end() - 1;
    }
    it->n++;
    it->baseline_ttft_ms += bs.ttft_ms;
    it->choreo_ttft_ms += cs.ttft_ms;
    it->baseline_computed += bs.n_computed;
    it->choreo_computed += cs.n_computed;
    it->baseline_reused += bs.n_reused;
    it->choreo_reused += cs.n_reused;
  }
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / double(v.size());
}

/// The steps, means and ratios of `p`'s instances.
void sum_up(WorkflowProfile& p) {
  std::vector<double> b_ttft, c_ttft, b_e2e, c_e2e;
  double b_computed = 0, c_computed = 0, b_reused = 0, c_reused = 0, generated = 0;
  for (const ProfiledRow& row : p.instances) {
    const RunTiming& b = row.runs.baseline_timing;
    const RunTiming& c = row.runs.choreo_timing;
    b_ttft.push_back(b.ttft_ms);
    c_ttft.push_back(c.ttft_ms);
    b_e2e.push_back(b.e2e_ms);
    c_e2e.push_back(c.e2e_ms);
    b_computed += b.n_computed;
    c_computed += c.n_computed;
    b_reused += b.n_reused;
    c_reused += c.n_reused;
    generated += b.n_generated;
    p.n_unforced += row.runs.n_unforced;
    add_steps(p.steps, b, c);
  }
  p.ttft = stats::bootstrap_ratio(b_ttft, c_ttft);
  p.e2e = stats::bootstrap_ratio(b_e2e, c_e2e);
  const double n = double(p.instances.size());
  p.means = {mean(b_ttft),   mean(c_ttft), mean(b_e2e),  mean(c_e2e),  b_computed / n,
             c_computed / n, b_reused / n, c_reused / n, generated / n};
}

}  // namespace

std::vector<DecodeBatch> decode_batches(const RunResult& result) {
  std::map<double, std::vector<size_t>> batches;
  for (size_t i = 0; i < result.messages.size(); ++i)
    if (result.messages[i].kind == "decode") batches[result.messages[i].start_ms].push_back(i);
  std::vector<DecodeBatch> out;
  for (auto& [start, members] : batches) {
    std::vector<const MessageRecord*> records;
    for (size_t i : members) records.push_back(&result.messages[i]);
    out.push_back({batch_label(records), std::move(members)});
  }
  return out;
}

RunTiming timing_of(const RunResult& result) {
  RunTiming t;
  if (result.messages.empty()) return t;
  double first = result.messages.front().start_ms, last = first;
  for (const MessageRecord& m : result.messages) {
    first = std::min(first, m.start_ms);
    last = std::max(last, m.start_ms + m.total_ms);
    t.n_computed += m.n_computed;
    t.n_reused += m.n_reused;
    if (m.kind == "decode") t.n_generated += m.n_generated;
  }
  t.e2e_ms = last - first;
  for (const DecodeBatch& batch : decode_batches(result)) {
    StepTiming s;
    s.label = batch.label;
    s.size = int(batch.messages.size());
    for (size_t i : batch.messages) {
      const MessageRecord& m = result.messages[i];
      s.ttft_ms = std::max(s.ttft_ms, m.ttft_ms);
      s.total_ms = std::max(s.total_ms, m.total_ms);
      s.n_computed += m.n_computed;
      s.n_reused += m.n_reused;
      s.n_generated += m.n_generated;
    }
    t.ttft_ms += s.ttft_ms;
    t.steps.push_back(s);
  }
  return t;
}

ProfiledInstance profile_instance(const dsl::Workflow& workflow, runtime::Engine& baseline, runtime::Engine& choreo,
                                  const RunArguments& arguments) {
  ProfiledInstance p;
  p.baseline = run_workflow(workflow, baseline, arguments);
  std::map<std::string, int> generated;
  for (const MessageRecord& m : p.baseline.messages)
    if (m.kind == "decode") generated[m.name] = m.n_generated;
  RunHooks hooks;
  hooks.exact_tokens = [&](const std::string& name) -> std::optional<int> {
    auto it = generated.find(name);
    if (it == generated.end()) {
      ++p.n_unforced;
      return std::nullopt;
    }
    return std::max(it->second, 1);  // a decode generates at least one token
  };
  p.choreo = run_workflow(workflow, choreo, arguments, hooks);
  p.baseline_timing = timing_of(p.baseline);
  p.choreo_timing = timing_of(p.choreo);
  return p;
}

WorkflowProfile profile_workflow(const dsl::Workflow& workflow, const WorkflowProfileOptions& o) {
  if (o.baseline_mode == runtime::Mode::Choreo)
    throw InputError("--baseline must be prefix or naive", "the choreo run is the one being measured");
  const std::vector<InputRow> rows = instance_rows(workflow, o.inputs_path, o.arguments, o.input_fields, o.limit);
  if (!o.json_path.empty()) check_writable(o.json_path, "--json");
  runtime::ModelOptions model_options = o.models;
  model_options.add_models = workflow_models_adder(workflow);
  const std::shared_ptr<runtime::LoadedModels> loaded = runtime::load_models(model_options);
  // Warm-up (page faults on the weights, thread start), on a scratch engine so neither cache sees it;
  // first, so that the backend is told the engines' T0 budget last (Backend::set_kv_budget).
  runtime::warm_up(loaded->models(), o.engine.page_tokens);
  runtime::EngineOptions baseline_options = o.engine, choreo_options = o.engine;
  baseline_options.mode = o.baseline_mode;
  choreo_options.mode = runtime::Mode::Choreo;

  WorkflowProfile p;
  p.workflow = workflow.name.value;
  p.model_path = loaded->model().file().path();
  p.baseline_mode = o.baseline_mode;
  // KV that outgrows the T0 budget is evicted (docs/store.md, "Tiers"), with the same results.
  std::unique_ptr<runtime::OpenedEngine> warm_choreo;
  if (!o.cold) warm_choreo = runtime::open_engine(loaded, choreo_options);
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::unique_ptr<runtime::OpenedEngine> baseline = runtime::open_engine(loaded, baseline_options);
    std::unique_ptr<runtime::OpenedEngine> cold_choreo;
    if (o.cold) cold_choreo = runtime::open_engine(loaded, choreo_options);
    runtime::Engine& choreo = o.cold ? cold_choreo->engine() : warm_choreo->engine();
    try {
      p.instances.push_back(
          {rows[i].line, profile_instance(workflow, baseline->engine(), choreo, rows[i].arguments)});
    } catch (...) {
      // The JSON document still gets the instances measured so far, marked incomplete.
      if (!o.json_path.empty())
        write_json(o.json_path, {{"workflow", p.workflow},
                                 {"model", p.model_path},
                                 {"baseline_mode", std::string(runtime::mode_name(p.baseline_mode))},
                                 {"incomplete", true},
                                 {"error", fmt::format("row at line {}: {}", rows[i].line,
                                                       describe_error(std::current_exception()))},
                                 {"instances", instances_json(p.instances)}});
      throw;
    }
    if (o.on_instance) o.on_instance(i, rows.size(), p.instances.back().runs);
  }
  sum_up(p);
  if (!o.json_path.empty()) write_json(o.json_path, profile_json(p));
  return p;
}

nlohmann::ordered_json profile_json(const WorkflowProfile& p) {
  return {{"workflow", p.workflow},
          {"model", p.model_path},
          {"baseline_mode", std::string(runtime::mode_name(p.baseline_mode))},
          {"instances", instances_json(p.instances)},
          {"ttft_ratio", {{"ratio", p.ttft.ratio}, {"low", p.ttft.low}, {"high", p.ttft.high}}},
          {"e2e_ratio", {{"ratio", p.e2e.ratio}, {"low", p.e2e.low}, {"high", p.e2e.high}}}};
}

}  // namespace choreo::exec
