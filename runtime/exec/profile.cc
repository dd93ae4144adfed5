#include "runtime/exec/profile.h"

#include <algorithm>
#include <map>

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

}  // namespace

RunTiming timing_of(const RunResult& result) {
  RunTiming t;
  if (result.messages.empty()) return t;
  double first = result.messages.front().start_ms, last = first;
  // Decodes submitted together (one batch) share a start time; group them in order of submission.
  std::map<double, std::vector<const MessageRecord*>> batches;
  for (const MessageRecord& m : result.messages) {
    first = std::min(first, m.start_ms);
    last = std::max(last, m.start_ms + m.total_ms);
    t.n_computed += m.n_computed;
    t.n_reused += m.n_reused;
    if (m.kind != "decode") continue;
    t.n_generated += m.n_generated;
    batches[m.start_ms].push_back(&m);
  }
  t.e2e_ms = last - first;
  for (const auto& [start, members] : batches) {
    StepTiming s;
    s.label = batch_label(members);
    s.size = int(members.size());
    for (const MessageRecord* m : members) {
      s.ttft_ms = std::max(s.ttft_ms, m->ttft_ms);
      s.total_ms = std::max(s.total_ms, m->total_ms);
      s.n_computed += m->n_computed;
      s.n_reused += m->n_reused;
      s.n_generated += m->n_generated;
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

}  // namespace choreo::exec
