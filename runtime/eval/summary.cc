#include "runtime/eval/summary.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace choreo::eval {

namespace {

/// A mode's rows keyed and ordered by row id, so the bootstrap sees the same order however the rows were
/// sharded, merged or resumed.
using RowsById = std::map<std::string, const ResultRow*>;

double mean_or_zero(double sum, size_t n) { return n == 0 ? 0.0 : sum / static_cast<double>(n); }

ModeSummary summarize_mode(const std::string& mode, const RowsById& rows) {
  ModeSummary out;
  out.mode = mode;
  std::vector<double> scores;
  double ttft = 0, e2e = 0;
  for (const auto& [id, row] : rows) {
    scores.push_back(row->score);
    ttft += row->ttft_ms;
    e2e += row->e2e_ms;
    out.tokens_generated += row->tokens_generated;
    out.tokens_computed += row->tokens_computed;
    out.tokens_reused += row->tokens_reused;
    if (!row->subject.empty()) {
      out.by_subject[row->subject].n++;
      out.by_subject[row->subject].sum += row->score;
    }
    if (!row->level.empty()) {
      out.by_level[row->level].n++;
      out.by_level[row->level].sum += row->score;
    }
  }
  out.score = stats::bootstrap_mean(scores);
  out.ttft_ms = mean_or_zero(ttft, rows.size());
  out.e2e_ms = mean_or_zero(e2e, rows.size());
  return out;
}

bool all_binary(const RowsById& rows) {
  return std::all_of(rows.begin(), rows.end(),
                     [](const auto& kv) { return kv.second->score == 0.0 || kv.second->score == 1.0; });
}

std::optional<double> ratio(double baseline, double treatment) {
  if (!(treatment > 0) || !(baseline > 0)) return std::nullopt;
  return baseline / treatment;
}

Comparison compare(const std::string& baseline, const RowsById& base_rows, const std::string& treatment,
                   const RowsById& treated_rows) {
  Comparison out;
  out.baseline = baseline;
  out.treatment = treatment;
  std::vector<double> before, after;
  double base_ttft = 0, treated_ttft = 0, base_e2e = 0, treated_e2e = 0;
  for (const auto& [id, row] : base_rows) {
    auto other = treated_rows.find(id);
    if (other == treated_rows.end()) continue;
    before.push_back(row->score);
    after.push_back(other->second->score);
    base_ttft += row->ttft_ms, treated_ttft += other->second->ttft_ms;
    base_e2e += row->e2e_ms, treated_e2e += other->second->e2e_ms;
  }
  out.n_pairs = before.size();
  out.difference = stats::paired_difference(before, after);
  if (all_binary(base_rows) && all_binary(treated_rows)) out.mcnemar = stats::mcnemar(before, after);
  out.ttft_ratio = ratio(base_ttft, treated_ttft);
  out.e2e_ratio = ratio(base_e2e, treated_e2e);
  return out;
}

std::string percent(double fraction) { return fmt::format("{:.2f}", 100.0 * fraction); }

std::string interval(const stats::Estimate& e) {
  return fmt::format("{} [{}, {}]", percent(e.mean), percent(e.low), percent(e.high));
}

nlohmann::ordered_json estimate_json(const stats::Estimate& e) {
  return {{"n", e.n}, {"mean", 100.0 * e.mean}, {"ci95_low", 100.0 * e.low}, {"ci95_high", 100.0 * e.high}};
}

nlohmann::ordered_json groups_json(const std::map<std::string, GroupAccuracy>& groups) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& [name, g] : groups) out[name] = {{"n", g.n}, {"mean", 100.0 * mean_or_zero(g.sum, g.n)}};
  return out;
}

std::string optional_ratio(const std::optional<double>& r) { return r ? fmt::format("{:.2f}x", *r) : "n/a"; }

}  // namespace

Summary summarize(const std::vector<ResultRow>& rows) {
  Summary out;
  std::map<std::string, RowsById> by_mode;
  for (const ResultRow& row : rows) {
    by_mode[row.mode][row.id] = &row;
    if (out.metric.empty())
      out.metric = row.metric;
    else if (out.metric != row.metric)
      out.metric = "mixed";
  }
  if (by_mode.empty()) return out;
  // The baseline first, then the other modes by name: the same summary whatever order the rows came in.
  std::string baseline = by_mode.begin()->first;
  for (const char* preferred : {"naive", "prefix"})
    if (by_mode.count(preferred)) baseline = preferred;
  out.modes.push_back(summarize_mode(baseline, by_mode[baseline]));
  for (const auto& [mode, mode_rows] : by_mode) {
    if (mode == baseline) continue;
    out.modes.push_back(summarize_mode(mode, mode_rows));
    out.comparisons.push_back(compare(baseline, by_mode[baseline], mode, mode_rows));
  }
  return out;
}

std::string format_summary(const Summary& summary) {
  std::string out = fmt::format("metric: {} (scores x100, 95% bootstrap CI)\n", summary.metric);
  out += fmt::format("{:<12} {:>6}  {:<26} {:>10} {:>10} {:>10} {:>10} {:>10}\n", "mode", "n",
                     "score [95% CI]", "ttft_ms", "e2e_ms", "generated", "computed", "reused");
  for (const ModeSummary& m : summary.modes)
    out += fmt::format("{:<12} {:>6}  {:<26} {:>10.1f} {:>10.1f} {:>10} {:>10} {:>10}\n", m.mode, m.score.n,
                       interval(m.score), m.ttft_ms, m.e2e_ms, m.tokens_generated, m.tokens_computed,
                       m.tokens_reused);
  for (const ModeSummary& m : summary.modes) {
    for (const auto* groups : {&m.by_subject, &m.by_level}) {
      if (groups->empty()) continue;
      out += fmt::format("  {} by {}:", m.mode, groups == &m.by_subject ? "subject" : "level");
      for (const auto& [name, g] : *groups) out += fmt::format("  {} {}/{}", name, g.sum, g.n);
      out += "\n";
    }
  }
  for (const Comparison& c : summary.comparisons) {
    out += fmt::format("{} vs {} ({} paired rows): difference {} [{}, {}]", c.treatment, c.baseline,
                       c.n_pairs, fmt::format("{:+.2f}", 100.0 * c.difference.mean),
                       percent(c.difference.low), percent(c.difference.high));
    if (c.mcnemar)
      out += fmt::format("; McNemar b={} c={} p={:.4g}", c.mcnemar->b, c.mcnemar->c, c.mcnemar->p_value);
    out += fmt::format("; TTFT ratio {}, end-to-end ratio {} ({} / {})\n", optional_ratio(c.ttft_ratio),
                       optional_ratio(c.e2e_ratio), c.baseline, c.treatment);
  }
  return out;
}

nlohmann::ordered_json summary_to_json(const Summary& summary) {
  nlohmann::ordered_json out;
  out["metric"] = summary.metric;
  out["modes"] = nlohmann::ordered_json::array();
  for (const ModeSummary& m : summary.modes) {
    nlohmann::ordered_json j;
    j["mode"] = m.mode;
    j["score"] = estimate_json(m.score);
    j["ttft_ms"] = m.ttft_ms;
    j["e2e_ms"] = m.e2e_ms;
    j["tokens_generated"] = m.tokens_generated;
    j["tokens_computed"] = m.tokens_computed;
    j["tokens_reused"] = m.tokens_reused;
    if (!m.by_subject.empty()) j["by_subject"] = groups_json(m.by_subject);
    if (!m.by_level.empty()) j["by_level"] = groups_json(m.by_level);
    out["modes"].push_back(j);
  }
  out["comparisons"] = nlohmann::ordered_json::array();
  for (const Comparison& c : summary.comparisons) {
    nlohmann::ordered_json j;
    j["baseline"] = c.baseline;
    j["treatment"] = c.treatment;
    j["n_pairs"] = c.n_pairs;
    j["difference"] = estimate_json(c.difference);
    if (c.mcnemar) j["mcnemar"] = {{"b", c.mcnemar->b}, {"c", c.mcnemar->c}, {"p", c.mcnemar->p_value}};
    j["ttft_ratio"] = c.ttft_ratio ? nlohmann::ordered_json(*c.ttft_ratio) : nlohmann::ordered_json();
    j["e2e_ratio"] = c.e2e_ratio ? nlohmann::ordered_json(*c.e2e_ratio) : nlohmann::ordered_json();
    out["comparisons"].push_back(j);
  }
  return out;
}

}  // namespace choreo::eval
