#include "runtime/eval/quality_profile.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/atomic_file.h"
#include "common/error.h"
#include "runtime/exec/instances.h"
#include "runtime/exec/profile.h"
#include "runtime/exec/workflow_models.h"

namespace choreo::eval {

namespace {

/// The summary of one label (a step, or the whole workflow) from its tally in each instance.
QualitySummary summarize(const std::string& label, const std::vector<CallQuality>& per_instance) {
  QualitySummary s;
  s.label = label;
  std::vector<double> kl, rank, agreement, exact_rank, exact_agreement;
  for (const CallQuality& t : per_instance) {
    s.baseline_computed += t.baseline_computed;
    s.computed += t.computed;
    if (t.n_positions == 0) continue;
    s.n_positions += t.n_positions;
    s.kl_max = std::max(s.kl_max, t.kl_max);
    kl.push_back(t.kl());
    rank.push_back(t.rank());
    agreement.push_back(t.agreement());
    exact_rank.push_back(t.exact_rank());
    exact_agreement.push_back(t.exact_agreement());
  }
  if (!per_instance.empty()) {
    s.baseline_computed /= double(per_instance.size());
    s.computed /= double(per_instance.size());
  }
  s.kl = stats::bootstrap_mean(kl);
  s.rank = stats::bootstrap_mean(rank);
  s.agreement = stats::bootstrap_mean(agreement);
  s.exact_rank = stats::bootstrap_mean(exact_rank);
  s.exact_agreement = stats::bootstrap_mean(exact_agreement);
  return s;
}

nlohmann::ordered_json estimate_json(const stats::Estimate& e) {
  return {{"mean", e.mean}, {"low", e.low}, {"high", e.high}};
}

nlohmann::ordered_json summary_json(const QualitySummary& s, const std::string& variant) {
  nlohmann::ordered_json kl = estimate_json(s.kl);
  kl["max"] = s.kl_max;
  return {{"label", s.label},
          {"instances", s.kl.n},
          {"positions", s.n_positions},
          {"kl", kl},
          {"rank", estimate_json(s.rank)},
          {"agreement", estimate_json(s.agreement)},
          {"exact_rank", estimate_json(s.exact_rank)},
          {"exact_agreement", estimate_json(s.exact_agreement)},
          {"computed", {{"baseline", s.baseline_computed}, {variant, s.computed}}}};
}

nlohmann::ordered_json call_json(const CallQuality& c, int line, const std::string& variant) {
  return {{"line", line},
          {"call", c.call},
          {"step", c.step},
          {"positions", c.n_positions},
          {"kl", {{"mean", c.kl()}, {"max", c.kl_max}}},
          {"rank", {{"mean", c.rank()}, {"max", c.rank_max}}},
          {"agreement", c.agreement()},
          {"exact_rank", c.exact_rank()},
          {"exact_agreement", c.exact_agreement()},
          {"computed", {{"baseline", c.baseline_computed}, {variant, c.computed}}}};
}

/// The calls and per-instance totals of variant `v`, for the JSON document.
nlohmann::ordered_json variant_calls_json(const std::vector<QualityInstance>& instances, size_t v,
                                          const std::string& name) {
  nlohmann::ordered_json calls = nlohmann::ordered_json::array(), runs = nlohmann::ordered_json::array();
  for (const QualityInstance& instance : instances) {
    const VariantRun& run = instance.variants[v];
    runs.push_back({{"line", instance.line},
                    {"computed", {{"baseline", instance.baseline_computed}, {name, run.computed}}},
                    {"unforced_decodes", run.n_unforced}});
    for (const CallQuality& c : run.calls) calls.push_back(call_json(c, instance.line, name));
  }
  return {{"runs", runs}, {"calls", calls}};
}

nlohmann::ordered_json header_json(const QualityProfile& p) {
  return {{"workflow", p.workflow},
          {"model", p.model_path},
          {"baseline_mode", "prefix"},
          {"instances", p.instances.size()}};
}

void write_json(const std::string& path, const nlohmann::ordered_json& doc) {
  write_file_atomically(path, doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

/// The JSON document of instances compared before one failed: header, each variant's calls, the error.
nlohmann::ordered_json incomplete_json(const QualityProfile& p, const std::string& error) {
  nlohmann::ordered_json doc = header_json(p);
  doc["incomplete"] = true;
  doc["error"] = error;
  doc["variants"] = nlohmann::ordered_json::array();
  for (size_t v = 0; v < p.variant_names.size(); ++v) {
    nlohmann::ordered_json variant = {{"variant", p.variant_names[v]}};
    variant.update(variant_calls_json(p.instances, v, p.variant_names[v]));
    doc["variants"].push_back(variant);
  }
  return doc;
}

}  // namespace

std::vector<QualityVariant> repair_variants(const RepairPolicy& policy) {
  std::vector<QualityVariant> out;
  for (const RepairPolicy& p : {RepairPolicy{}, policy})
    out.push_back({p.name(), [p](runtime::EngineOptions& options) { options.repair = p; }});
  return out;
}

QualityInstance compare_instance(const dsl::Workflow& workflow, runtime::Engine& baseline,
                                 std::span<runtime::Engine* const> variants,
                                 const exec::RunArguments& arguments) {
  const exec::RunResult exact = run_baseline(workflow, baseline, arguments);
  QualityInstance out;
  out.baseline_computed = exec::timing_of(exact).n_computed;
  for (runtime::Engine* engine : variants) {
    VariantRun run;
    const exec::RunResult forced = run_teacher_forced(workflow, *engine, arguments, exact, run.n_unforced);
    run.calls = compare_calls(exact, forced);
    run.computed = exec::timing_of(forced).n_computed;
    out.variants.push_back(std::move(run));
  }
  return out;
}

VariantQuality summarize_variant(const std::vector<QualityInstance>& instances, size_t variant,
                                 const std::string& name, const std::string& workflow_name) {
  VariantQuality q;
  q.name = name;
  std::vector<std::string> labels;                        // in order of first occurrence
  std::map<std::string, std::vector<CallQuality>> steps;  // per label: one tally per instance that has it
  std::vector<CallQuality> whole;                         // one tally per instance
  for (const QualityInstance& instance : instances) {
    const VariantRun& run = instance.variants[variant];
    q.n_unforced += run.n_unforced;
    std::map<std::string, CallQuality> by_step;
    CallQuality all;
    for (const CallQuality& c : run.calls) {
      if (std::find(labels.begin(), labels.end(), c.step) == labels.end()) labels.push_back(c.step);
      by_step[c.step].add(c);
      all.add(c);
    }
    for (const auto& [label, tally] : by_step) steps[label].push_back(tally);
    // The workflow's computed tokens are the whole runs': static messages and prefills included.
    all.baseline_computed = instance.baseline_computed;
    all.computed = run.computed;
    whole.push_back(all);
  }
  for (const std::string& label : labels) q.steps.push_back(summarize(label, steps[label]));
  q.workflow = summarize(workflow_name, whole);
  return q;
}

QualityProfile profile_quality(const dsl::Workflow& workflow, const QualityOptions& o) {
  const std::vector<exec::InputRow> rows =
      exec::instance_rows(workflow, o.inputs_path, o.arguments, o.input_fields, o.limit);
  if (!o.json_path.empty()) check_writable(o.json_path, "--json");
  runtime::ModelOptions model_options = o.models;
  model_options.add_models = exec::workflow_models_adder(workflow);
  const std::shared_ptr<runtime::LoadedModels> loaded = runtime::load_models(model_options);
  runtime::EngineOptions baseline_options = o.engine;
  baseline_options.mode = runtime::Mode::Prefix;
  baseline_options.repair.reset();  // exact: nothing to repair
  QualityProfile p;
  p.workflow = workflow.name.value;
  p.model_path = loaded->model().file().path();
  for (const QualityVariant& v : o.variants) p.variant_names.push_back(v.name);
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::unique_ptr<runtime::OpenedEngine> baseline = runtime::open_engine(loaded, baseline_options);
    std::vector<std::unique_ptr<runtime::OpenedEngine>> opened;
    std::vector<runtime::Engine*> engines;
    for (const QualityVariant& v : o.variants) {
      runtime::EngineOptions options = o.engine;
      options.mode = runtime::Mode::Choreo;
      if (v.configure) v.configure(options);
      opened.push_back(runtime::open_engine(loaded, options));
      engines.push_back(&opened.back()->engine());
    }
    try {
      p.instances.push_back(compare_instance(workflow, baseline->engine(), engines, rows[i].arguments));
      p.instances.back().line = rows[i].line;
    } catch (...) {
      if (!o.json_path.empty())
        write_json(o.json_path, incomplete_json(p, fmt::format("row at line {}: {}", rows[i].line,
                                                               describe_error(std::current_exception()))));
      throw;
    }
    if (o.on_instance) o.on_instance(i, rows.size(), p.instances.back());
  }
  for (size_t v = 0; v < o.variants.size(); ++v)
    p.variants.push_back(summarize_variant(p.instances, v, o.variants[v].name, p.workflow));
  if (!o.json_path.empty()) write_json(o.json_path, quality_json(p));
  return p;
}

nlohmann::ordered_json quality_json(const QualityProfile& p) {
  nlohmann::ordered_json doc = header_json(p);
  doc["variants"] = nlohmann::ordered_json::array();
  for (size_t v = 0; v < p.variants.size(); ++v) {
    const VariantQuality& q = p.variants[v];
    nlohmann::ordered_json steps = nlohmann::ordered_json::array();
    for (const QualitySummary& s : q.steps) steps.push_back(summary_json(s, q.name));
    nlohmann::ordered_json variant = {{"variant", q.name},
                                      {"workflow", summary_json(q.workflow, q.name)},
                                      {"steps", steps},
                                      {"unforced_decodes", q.n_unforced}};
    variant.update(variant_calls_json(p.instances, v, q.name));
    doc["variants"].push_back(variant);
  }
  return doc;
}

}  // namespace choreo::eval
