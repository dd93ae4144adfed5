#include "runtime/eval/quality.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <utility>

#include "runtime/eval/divergence.h"
#include "runtime/exec/profile.h"
#include "runtime/model/sampler.h"

namespace choreo::eval {

namespace {

/// A decode's name and occurrence (0 for the first decode of that name in the run): what matches a call of
/// one run with the same call of another.
using CallKey = std::pair<std::string, int>;

/// The decodes of `run` by name and occurrence: indices into run.messages.
std::map<CallKey, size_t> decodes_by_key(const exec::RunResult& run) {
  std::map<CallKey, size_t> out;
  std::map<std::string, int> seen;
  for (size_t i = 0; i < run.messages.size(); ++i)
    if (run.messages[i].kind == "decode") out[{run.messages[i].name, seen[run.messages[i].name]++}] = i;
  return out;
}

/// The step label of each decode of `run` (indexed like run.messages): its batch's label, with ` #k` on the
/// k-th batch of that label (k > 1), as `choreo profile` matches steps.
std::vector<std::string> step_labels(const exec::RunResult& run) {
  std::vector<std::string> labels(run.messages.size());
  std::map<std::string, int> seen;
  for (const exec::DecodeBatch& batch : exec::decode_batches(run)) {
    const int occurrence = seen[batch.label]++;
    const std::string label = batch.label + (occurrence ? fmt::format(" #{}", occurrence + 1) : "");
    for (size_t i : batch.messages) labels[i] = label;
  }
  return labels;
}

/// The tokens a decode generated (the tail of its message).
std::vector<Token> generated_tokens(const exec::MessageRecord& m) {
  return {m.tokens.end() - m.n_generated, m.tokens.end()};
}

}  // namespace

void CallQuality::add(const CallQuality& other) {
  n_positions += other.n_positions;
  kl_sum += other.kl_sum;
  kl_max = std::max(kl_max, other.kl_max);
  rank_sum += other.rank_sum;
  rank_max = std::max(rank_max, other.rank_max);
  n_agree += other.n_agree;
  exact_rank_sum += other.exact_rank_sum;
  n_agree_exact += other.n_agree_exact;
  baseline_computed += other.baseline_computed;
  computed += other.computed;
}

void add_position(CallQuality& into, std::span<const float> p, std::span<const float> q, Token token) {
  const double kl = kl_divergence(p, q);
  const int rank = token_rank(q, token);
  into.n_positions++;
  into.kl_sum += kl;
  into.kl_max = std::max(into.kl_max, kl);
  into.rank_sum += rank;
  into.rank_max = std::max(into.rank_max, rank);
  into.n_agree += model::argmax(q) == token;
  into.exact_rank_sum += token_rank(p, token);
  into.n_agree_exact += model::argmax(p) == token;
}

exec::RunResult run_baseline(const dsl::Workflow& workflow, runtime::Engine& engine,
                             const exec::RunArguments& arguments) {
  exec::RunHooks hooks;
  hooks.record_logits = [](const std::string&) { return true; };
  return exec::run_workflow(workflow, engine, arguments, hooks);
}

exec::RunResult run_teacher_forced(const dsl::Workflow& workflow, runtime::Engine& engine,
                                   const exec::RunArguments& arguments, const exec::RunResult& baseline,
                                   int& n_unforced) {
  const std::map<CallKey, size_t> targets = decodes_by_key(baseline);
  std::map<std::string, int> seen;
  exec::RunHooks hooks;
  hooks.record_logits = [](const std::string&) { return true; };
  hooks.forced_tokens = [&](const std::string& name) -> std::optional<std::vector<Token>> {
    const auto it = targets.find({name, seen[name]++});
    // A decode that generated nothing cannot be forced (an empty forcing means none); it runs as written.
    if (it == targets.end() || baseline.messages[it->second].n_generated == 0) {
      ++n_unforced;
      return std::nullopt;
    }
    return generated_tokens(baseline.messages[it->second]);
  };
  return exec::run_workflow(workflow, engine, arguments, hooks);
}

std::vector<CallQuality> compare_calls(const exec::RunResult& baseline, const exec::RunResult& run) {
  const std::map<CallKey, size_t> compared = decodes_by_key(run);
  const std::vector<std::string> labels = step_labels(baseline);
  std::map<std::string, int> seen;
  std::vector<CallQuality> calls;
  for (size_t i = 0; i < baseline.messages.size(); ++i) {
    const exec::MessageRecord& b = baseline.messages[i];
    if (b.kind != "decode") continue;
    const auto it = compared.find({b.name, seen[b.name]++});
    if (it == compared.end()) continue;
    const exec::MessageRecord& r = run.messages[it->second];
    const std::vector<Token> tokens = generated_tokens(b);
    if (generated_tokens(r) != tokens) continue;  // not forced: other token sequences are not comparable
    CallQuality q;
    q.call = b.name;
    q.step = labels[i];
    q.baseline_computed = b.n_computed;
    q.computed = r.n_computed;
    const size_t n = std::min({b.logits.size(), r.logits.size(), tokens.size()});
    for (size_t t = 0; t < n; ++t) add_position(q, b.logits[t], r.logits[t], tokens[t]);
    calls.push_back(std::move(q));
  }
  return calls;
}

}  // namespace choreo::eval
