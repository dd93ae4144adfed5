#include "runtime/eval/repair_sweep.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/input_file.h"
#include "runtime/eval/svg_fit.h"

namespace choreo::eval {

namespace {

RoundRange round_range(const std::vector<double>& per_round) {
  if (per_round.empty()) return {};
  const auto [lo, hi] = std::minmax_element(per_round.begin(), per_round.end());
  return {std::accumulate(per_round.begin(), per_round.end(), 0.0) / double(per_round.size()), *lo, *hi};
}

std::string range_text(const RoundRange& r) {
  return fmt::format("{:.2f}x [{:.2f}-{:.2f}]", r.mean, r.min, r.max);
}

// ---- the scatter ------------------------------------------------------------------------------------

constexpr double kWidth = 680, kLeft = 80, kRight = 40, kPlotHeight = 340, kBottom = 56, kFont = 13;

/// Ticks at round values covering [0, top]: about five of them.
std::vector<double> ticks_to(double top) {
  if (!(top > 0)) return {0};
  const double raw = top / 5, magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * magnitude >= raw) {
      step = m * magnitude;
      break;
    }
  std::vector<double> out;
  for (int i = 0; i * step <= top * (1 + 1e-9); ++i) out.push_back(i * step);
  return out;
}

}  // namespace

std::vector<RepairPolicy> sweep_policies() {
  std::vector<RepairPolicy> out = {RepairPolicy{}};
  for (int k : {1, 4, 16, 64}) out.push_back(parse_repair_policy(fmt::format("first:{}", k)));
  for (const char* r : {"0.05", "0.15", "0.3"}) out.push_back(parse_repair_policy(fmt::format("select:{}", r)));
  return out;
}

std::vector<size_t> pareto_rows(std::span<const double> x, std::span<const double> kl) {
  std::vector<size_t> out;
  for (size_t i = 0; i < x.size(); ++i) {
    bool dominated = false;
    for (size_t j = 0; j < x.size() && !dominated; ++j) {
      if (j == i) continue;
      const bool no_worse = x[j] <= x[i] && kl[j] <= kl[i];
      const bool better = x[j] < x[i] || kl[j] < kl[i];
      dominated = no_worse && (better || j < i);  // an equal row earlier in the list is kept instead
    }
    if (!dominated) out.push_back(i);
  }
  std::stable_sort(out.begin(), out.end(), [&](size_t a, size_t b) { return x[a] < x[b]; });
  return out;
}

RepairSweep summarize_sweep(const QualityProfile& p, int rounds, std::optional<double> max_kl) {
  RepairSweep s;
  s.workflow = p.workflow;
  s.model = p.model_path;
  s.instances = p.instances.size();
  s.rounds = rounds;
  for (const VariantQuality& q : p.variants) {
    SweepRow row;
    row.policy = q.name;
    row.kl = q.workflow.kl;
    row.agreement = q.workflow.agreement.mean;
    row.computed = q.workflow.computed;
    row.ttft_ms = q.ttft_ms;
    row.e2e_ms = q.e2e_ms;
    row.ttft_speedup = round_range(q.ttft_speedup);
    row.e2e_speedup = round_range(q.e2e_speedup);
    s.baseline_computed = q.workflow.baseline_computed;
    s.baseline_ttft_ms = q.baseline_ttft_ms;
    s.baseline_e2e_ms = q.baseline_e2e_ms;
    s.rows.push_back(row);
  }
  if (s.rows.empty()) return s;
  const SweepRow& none = s.rows.front();
  for (SweepRow& row : s.rows) {
    row.gap_closed = none.kl.mean > 0 ? 1 - row.kl.mean / none.kl.mean : 0;
    row.speedup_kept = none.ttft_speedup.mean > 0 ? row.ttft_speedup.mean / none.ttft_speedup.mean : 0;
  }
  std::vector<double> computed, kl;
  for (const SweepRow& row : s.rows) {
    computed.push_back(row.computed);
    kl.push_back(row.kl.mean);
  }
  for (size_t i : pareto_rows(computed, kl)) s.rows[i].frontier = true;
  s.max_kl_given = max_kl.has_value();
  s.max_kl = max_kl.value_or(none.kl.mean / 2);
  for (size_t i = 0; i < s.rows.size(); ++i) {
    if (!(kl[i] <= s.max_kl)) continue;
    if (!s.chosen || computed[i] < computed[*s.chosen] ||
        (computed[i] == computed[*s.chosen] && kl[i] < kl[*s.chosen]))
      s.chosen = i;
  }
  return s;
}

std::string sweep_table(const RepairSweep& s) {
  std::string out = fmt::format(
      "{} on {} instance(s), {} round(s), model {}; exact baseline (prefix mode): {:.0f} tokens computed, "
      "TTFT {:.1f} ms, end-to-end {:.1f} ms per instance\n\n",
      s.workflow, s.instances, s.rounds, s.model, s.baseline_computed, s.baseline_ttft_ms, s.baseline_e2e_ms);
  out +=
      "| policy | KL [95% CI] | gap closed | agreement | computed | TTFT ms | TTFT speed-up [rounds] | kept | "
      "e2e speed-up [rounds] | frontier |\n|---|---|---|---|---|---|---|---|---|---|\n";
  for (size_t i = 0; i < s.rows.size(); ++i) {
    const SweepRow& r = s.rows[i];
    out += fmt::format("| {}{} | {:.4g} [{:.4g}, {:.4g}] | {:.0f}% | {:.3f} | {:.0f} | {:.1f} | {} | {:.0f}% | {} | {} |\n",
                       r.policy, s.chosen == i ? " (chosen)" : "", r.kl.mean, r.kl.low, r.kl.high,
                       100 * r.gap_closed, r.agreement, r.computed, r.ttft_ms, range_text(r.ttft_speedup),
                       100 * r.speedup_kept, range_text(r.e2e_speedup), r.frontier ? "yes" : "");
  }
  out += fmt::format("\nbound: KL <= {:.4g} ({}); ", s.max_kl,
                     s.max_kl_given ? "--max-kl" : "half of none's KL: closes at least half the gap");
  out += s.chosen ? fmt::format("chosen: {} (the fewest tokens computed under the bound)\n",
                                s.rows[*s.chosen].policy)
                  : std::string("no policy is under the bound; none chosen\n");
  return out;
}

std::string sweep_svg(const RepairSweep& s, SweepAxis axis) {
  const bool by_ttft = axis == SweepAxis::Ttft;
  std::vector<double> x, kl;
  for (const SweepRow& r : s.rows) {
    x.push_back(by_ttft ? r.ttft_ms : r.computed);
    kl.push_back(r.kl.mean);
  }
  const std::string title = fmt::format("{}: KL to the exact baseline against {}, {} instance(s)", s.workflow,
                                        by_ttft ? "TTFT" : "tokens computed", s.instances);
  const std::vector<std::string> lines = wrap_to_width(title, kFont + 2, kWidth - 20);
  const double top = 16 + 20.0 * double(lines.size()) + 20;
  const double height = top + kPlotHeight + kBottom;
  const double x_top =
      std::max(x.empty() ? 1 : *std::max_element(x.begin(), x.end()),
               by_ttft ? s.baseline_ttft_ms : s.baseline_computed) * 1.1;
  double y_top = kl.empty() ? 1 : std::max(*std::max_element(kl.begin(), kl.end()), s.max_kl) * 1.15;
  if (!(y_top > 0)) y_top = 1;
  const double plot_w = kWidth - kLeft - kRight;
  const auto px = [&](double v) { return kLeft + plot_w * v / (x_top > 0 ? x_top : 1); };
  const auto py = [&](double v) { return top + kPlotHeight * (1 - v / y_top); };
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"{2}\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      kWidth, height, kFont);
  for (size_t i = 0; i < lines.size(); ++i)
    out += fmt::format("<text x=\"10\" y=\"{}\" font-weight=\"bold\" font-size=\"{}\">{}</text>\n",
                       22 + 20 * i, kFont + 2, xml_escape(lines[i]));
  out += fmt::format("<text x=\"10\" y=\"{}\" fill=\"#555\">{}</text>\n", top - 8,
                     xml_escape("dark line: Pareto frontier; red ring: chosen; dashed: the bound"));
  // Axes, ticks and labels.
  out += fmt::format("<path d=\"M{0} {1} V{2} H{3}\" stroke=\"black\" fill=\"none\"/>\n", kLeft, top,
                     top + kPlotHeight, kLeft + plot_w);
  for (double t : ticks_to(x_top / 1.1 * 1.05))
    out += fmt::format(
        "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"black\"/><text x=\"{0}\" y=\"{3}\" "
        "text-anchor=\"middle\">{4:g}</text>\n",
        px(t), top + kPlotHeight, top + kPlotHeight + 5, top + kPlotHeight + 19, t);
  for (double t : ticks_to(y_top / 1.15 * 1.1))
    out += fmt::format(
        "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"black\"/><text x=\"{3}\" y=\"{4}\" "
        "text-anchor=\"end\">{5:.3g}</text>\n",
        kLeft - 5, py(t), kLeft, kLeft - 8, py(t) + 4, t);
  out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", kLeft + plot_w / 2,
                     height - 12,
                     by_ttft ? "TTFT per instance, ms (sum of the decode steps')" : "tokens computed per instance");
  out += fmt::format(
      "<text transform=\"translate(18 {}) rotate(-90)\" text-anchor=\"middle\">KL per position, nats</text>\n",
      top + kPlotHeight / 2);
  out += fmt::format(
      "<line class=\"bound\" x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#888\" stroke-dasharray=\"5 4\"/>\n",
      kLeft, py(s.max_kl), kLeft + plot_w);
  // The frontier over this axis, then the points.
  std::string path;
  for (size_t i : pareto_rows(x, kl))
    path += fmt::format("{}{:.1f} {:.1f}", path.empty() ? "M" : " L", px(x[i]), py(kl[i]));
  if (!path.empty())
    out += fmt::format("<path class=\"frontier\" d=\"{}\" stroke=\"#333\" stroke-width=\"1.5\" fill=\"none\"/>\n",
                       path);
  for (size_t i = 0; i < s.rows.size(); ++i) {
    out += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4\" fill=\"#1f77b4\"><title>{}</title></circle>\n",
                       px(x[i]), py(kl[i]),
                       xml_escape(fmt::format("{}: KL {:.4g}, {:.0f} tokens, TTFT {:.1f} ms", s.rows[i].policy,
                                              kl[i], s.rows[i].computed, s.rows[i].ttft_ms)));
    out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\">{}</text>\n", px(x[i]) + 6,
                       py(kl[i]) - 6, xml_escape(s.rows[i].policy));
  }
  // The exact baseline: KL 0 at its own cost.
  const double base_x = by_ttft ? s.baseline_ttft_ms : s.baseline_computed;
  out += fmt::format(
      "<rect class=\"baseline\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"8\" height=\"8\" fill=\"black\"/><text "
      "x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"end\">exact baseline</text>\n",
      px(base_x) - 4, py(0) - 4, px(base_x) - 6, py(0) - 8);
  if (s.chosen)
    out += fmt::format(
        "<circle class=\"chosen\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"9\" fill=\"none\" stroke=\"#d62728\" "
        "stroke-width=\"2\"/>\n",
        px(x[*s.chosen]), py(kl[*s.chosen]));
  return out + "</svg>\n";
}

nlohmann::ordered_json repair_policy_json(const RepairSweep& s) {
  nlohmann::ordered_json out = {{"choreo_repair_policy", 1}};
  if (!s.chosen) return out;
  const SweepRow& r = s.rows[*s.chosen];
  out["policy"] = r.policy;
  out["max_kl"] = s.max_kl;
  out["max_kl_from"] = s.max_kl_given ? "--max-kl" : "half of none's KL";
  out["workflow"] = s.workflow;
  out["model"] = s.model;
  out["instances"] = s.instances;
  out["kl"] = {{"mean", r.kl.mean}, {"low", r.kl.low}, {"high", r.kl.high}, {"none", s.rows.front().kl.mean}};
  out["computed"] = {{"policy", r.computed}, {"none", s.rows.front().computed}, {"baseline", s.baseline_computed}};
  out["ttft_speedup"] = r.ttft_speedup.mean;
  return out;
}

RepairPolicy read_repair_policy_file(const std::string& path) {
  const std::string text = read_input_file(path, "repair policy file", input_policy().file_bytes);
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  const auto bad = [&](std::string_view what) {
    return InputError(fmt::format("{}: not a repair policy file: {}", path, what),
                      "give a policy (none, first:K, select:R) or the repair.json `choreo profile quality "
                      "--sweep -o DIR` writes");
  };
  if (j.is_discarded() || !j.is_object()) throw bad("not a JSON object");
  if (!j.contains("choreo_repair_policy") || j["choreo_repair_policy"] != 1) throw bad("no \"choreo_repair_policy\": 1");
  if (!j.contains("policy") || !j["policy"].is_string())
    throw bad("no \"policy\" (the sweep chose none: no policy was under its KL bound)");
  try {
    return parse_repair_policy(j["policy"].get<std::string>());
  } catch (const InputError& e) {
    throw bad(e.message());
  }
}

void write_sweep(const RepairSweep& s, const QualityProfile& profile, const std::string& dir) {
  std::filesystem::create_directories(dir);
  const std::filesystem::path d = dir;
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const SweepRow& r : s.rows)
    rows.push_back({{"policy", r.policy},
                    {"kl", {{"mean", r.kl.mean}, {"low", r.kl.low}, {"high", r.kl.high}}},
                    {"gap_closed", r.gap_closed},
                    {"agreement", r.agreement},
                    {"computed", r.computed},
                    {"ttft_ms", r.ttft_ms},
                    {"e2e_ms", r.e2e_ms},
                    {"ttft_speedup", {{"mean", r.ttft_speedup.mean}, {"min", r.ttft_speedup.min}, {"max", r.ttft_speedup.max}}},
                    {"e2e_speedup", {{"mean", r.e2e_speedup.mean}, {"min", r.e2e_speedup.min}, {"max", r.e2e_speedup.max}}},
                    {"speedup_kept", r.speedup_kept},
                    {"frontier", r.frontier}});
  nlohmann::ordered_json doc = {{"sweep", {{"rounds", s.rounds},
                                           {"max_kl", s.max_kl},
                                           {"chosen", s.chosen ? nlohmann::ordered_json(s.rows[*s.chosen].policy)
                                                               : nlohmann::ordered_json()},
                                           {"rows", rows}}},
                                {"quality", quality_json(profile)}};
  const auto json_text = [](const nlohmann::ordered_json& j) {
    return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  };
  write_file_atomically((d / "sweep.md").string(), sweep_table(s));
  write_file_atomically((d / "sweep.json").string(), json_text(doc));
  write_file_atomically((d / "pareto_computed.svg").string(), sweep_svg(s, SweepAxis::Computed));
  write_file_atomically((d / "pareto_ttft.svg").string(), sweep_svg(s, SweepAxis::Ttft));
  // No choice leaves no policy file behind, not even an earlier sweep's.
  if (s.chosen)
    write_file_atomically((d / "repair.json").string(), json_text(repair_policy_json(s)));
  else
    std::filesystem::remove(d / "repair.json");
}

}  // namespace choreo::eval
