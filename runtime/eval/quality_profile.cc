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
                    {"unforced_decodes", run.n_unforced},
                    {"ttft_ms", {{"baseline", instance.baseline_ttft_ms}, {name, run.ttft_ms}}},
                    {"e2e_ms", {{"baseline", instance.baseline_e2e_ms}, {name, run.e2e_ms}}}});
    for (const CallQuality& c : run.calls) calls.push_back(call_json(c, instance.line, name));
  }
  return {{"runs", runs}, {"calls", calls}};
}

nlohmann::ordered_json time_json(const VariantQuality& q) {
  return {{"ttft_ms", {{"baseline", q.baseline_ttft_ms}, {q.name, q.ttft_ms}}},
          {"e2e_ms", {{"baseline", q.baseline_e2e_ms}, {q.name, q.e2e_ms}}},
          {"ttft_speedup_per_round", q.ttft_speedup},
          {"e2e_speedup_per_round", q.e2e_speedup}};
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

/// Sets q's time figures from the instances' rounds of variant `variant`.
void summarize_time(const std::vector<QualityInstance>& instances, size_t variant, VariantQuality& q) {
  size_t rounds = SIZE_MAX, n = 0;
  for (const QualityInstance& instance : instances)
    rounds = std::min({rounds, instance.baseline_ttft_ms.size(), instance.variants[variant].ttft_ms.size()});
  if (instances.empty() || rounds == 0) return;
  for (size_t r = 0; r < rounds; ++r) {
    double base_ttft = 0, base_e2e = 0, ttft = 0, e2e = 0;
    for (const QualityInstance& instance : instances) {
      base_ttft += instance.baseline_ttft_ms[r];
      base_e2e += instance.baseline_e2e_ms[r];
      ttft += instance.variants[variant].ttft_ms[r];
      e2e += instance.variants[variant].e2e_ms[r];
    }
    q.baseline_ttft_ms += base_ttft;
    q.baseline_e2e_ms += base_e2e;
    q.ttft_ms += ttft;
    q.e2e_ms += e2e;
    n += instances.size();
    q.ttft_speedup.push_back(ttft > 0 ? base_ttft / ttft : 0.0);
    q.e2e_speedup.push_back(e2e > 0 ? base_e2e / e2e : 0.0);
  }
  for (double* x : {&q.baseline_ttft_ms, &q.baseline_e2e_ms, &q.ttft_ms, &q.e2e_ms}) *x /= double(n);
}

}  // namespace

std::vector<QualityVariant> policy_variants(std::span<const RepairPolicy> policies) {
  std::vector<QualityVariant> out;
  for (const RepairPolicy& p : policies)
    out.push_back({p.name(), [p](runtime::EngineOptions& options) { options.repair = p; }});
  return out;
}

std::vector<QualityVariant> repair_variants(const RepairPolicy& policy) {
  const RepairPolicy both[] = {RepairPolicy{}, policy};
  return policy_variants(both);
}

std::vector<QualityVariant> finetune_variants(const runtime::AdapterFile& adapter, const RepairPolicy& policy) {
  std::vector<QualityVariant> out = repair_variants(policy);  // none, policy
  out.insert(out.begin() + 1, {"adapter", out[0].configure, {adapter}});
  if (policy.none())
    out.pop_back();
  else
    out.push_back({"adapter+" + policy.name(), out[2].configure, {adapter}});
  return out;
}

QualityInstance compare_instance(const dsl::Workflow& workflow, runtime::Engine& baseline,
                                 std::span<runtime::Engine* const> variants,
                                 const exec::RunArguments& arguments) {
  const exec::RunResult exact = run_baseline(workflow, baseline, arguments);
  QualityInstance out;
  const exec::RunTiming exact_timing = exec::timing_of(exact);
  out.baseline_computed = exact_timing.n_computed;
  out.baseline_ttft_ms.push_back(exact_timing.ttft_ms);
  out.baseline_e2e_ms.push_back(exact_timing.e2e_ms);
  for (runtime::Engine* engine : variants) {
    VariantRun run;
    const exec::RunResult forced = run_teacher_forced(workflow, *engine, arguments, exact, run.n_unforced);
    run.calls = compare_calls(exact, forced);
    const exec::RunTiming timing = exec::timing_of(forced);
    run.computed = timing.n_computed;
    run.ttft_ms.push_back(timing.ttft_ms);
    run.e2e_ms.push_back(timing.e2e_ms);
    out.variants.push_back(std::move(run));
  }
  return out;
}

void time_instance(const dsl::Workflow& workflow, runtime::Engine& baseline,
                   std::span<runtime::Engine* const> variants, const exec::RunArguments& arguments,
                   size_t first, QualityInstance& instance) {
  const exec::RunResult exact = run_baseline(workflow, baseline, arguments);
  const exec::RunTiming exact_timing = exec::timing_of(exact);
  instance.baseline_ttft_ms.push_back(exact_timing.ttft_ms);
  instance.baseline_e2e_ms.push_back(exact_timing.e2e_ms);
  for (size_t k = 0; k < variants.size(); ++k) {
    const size_t v = (first + k) % variants.size();
    int n_unforced = 0;
    const exec::RunTiming timing =
        exec::timing_of(run_teacher_forced(workflow, *variants[v], arguments, exact, n_unforced));
    instance.variants[v].ttft_ms.push_back(timing.ttft_ms);
    instance.variants[v].e2e_ms.push_back(timing.e2e_ms);
  }
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
  summarize_time(instances, variant, q);
  return q;
}

QualityProfile profile_quality(const dsl::Workflow& workflow, const QualityOptions& o) {
  const std::vector<exec::InputRow> rows =
      exec::instance_rows(workflow, o.inputs_path, o.arguments, o.input_fields, o.limit);
  if (!o.json_path.empty()) check_writable(o.json_path, "--json");
  runtime::ModelOptions model_options = o.models;
  model_options.add_models = exec::workflow_models_adder(workflow);
  const std::shared_ptr<runtime::LoadedModels> loaded = runtime::load_models(model_options);
  runtime::warm_up(loaded->models(), o.engine.page_tokens);
  // Per variant, the models it runs on: the run's, or with the variant's adapters over them (loaded once per
  // list of adapters).
  std::vector<std::shared_ptr<runtime::LoadedModels>> variant_models;
  for (const QualityVariant& v : o.variants) {
    std::shared_ptr<runtime::LoadedModels> models = loaded;
    if (!v.adapters.empty()) {
      for (size_t u = 0; u < variant_models.size() && models == loaded; ++u)
        if (o.variants[u].adapters.size() == v.adapters.size() &&
            std::equal(v.adapters.begin(), v.adapters.end(), o.variants[u].adapters.begin(),
                       [](const runtime::AdapterFile& a, const runtime::AdapterFile& b) {
                         return a.path == b.path && a.scale == b.scale;
                       }))
          models = variant_models[u];
      if (models == loaded) {
        runtime::ModelOptions with = model_options;
        with.adapters.insert(with.adapters.end(), v.adapters.begin(), v.adapters.end());
        models = runtime::load_models(with);
        runtime::warm_up(models->models(), o.engine.page_tokens);
      }
    }
    variant_models.push_back(models);
  }
  runtime::EngineOptions baseline_options = o.engine;
  baseline_options.mode = runtime::Mode::Prefix;
  baseline_options.repair.reset();  // exact: nothing to repair
  QualityProfile p;
  p.workflow = workflow.name.value;
  p.model_path = loaded->model().file().path();
  for (const QualityVariant& v : o.variants) p.variant_names.push_back(v.name);
  for (size_t i = 0; i < rows.size(); ++i) {
    try {
      // Each round of each instance on fresh engines: every run is cold, as a chat API call is.
      for (int round = 0; round < std::max(1, o.rounds); ++round) {
        const std::unique_ptr<runtime::OpenedEngine> baseline = runtime::open_engine(loaded, baseline_options);
        std::vector<std::unique_ptr<runtime::OpenedEngine>> opened;
        std::vector<runtime::Engine*> engines;
        for (size_t v = 0; v < o.variants.size(); ++v) {
          runtime::EngineOptions options = o.engine;
          options.mode = runtime::Mode::Choreo;
          if (o.variants[v].configure) o.variants[v].configure(options);
          opened.push_back(runtime::open_engine(variant_models[v], options));
          engines.push_back(&opened.back()->engine());
        }
        if (round == 0) {
          p.instances.push_back(compare_instance(workflow, baseline->engine(), engines, rows[i].arguments));
          p.instances.back().line = rows[i].line;
        } else {
          time_instance(workflow, baseline->engine(), engines, rows[i].arguments, size_t(round) % engines.size(),
                        p.instances.back());
        }
      }
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
                                      {"unforced_decodes", q.n_unforced},
                                      {"time", time_json(q)}};
    variant.update(variant_calls_json(p.instances, v, q.name));
    doc["variants"].push_back(variant);
  }
  return doc;
}

}  // namespace choreo::eval
