#include "runtime/eval/reuse_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cassert>
#include <cmath>
#include <limits>
#include <map>
#include <utility>

#include "common/error.h"
#include "common/suggest.h"
#include "runtime/eval/svg_fit.h"

namespace choreo::eval {

namespace {

constexpr std::array<std::string_view, 3> kQualityNames = {"f1", "kl", "metric"};

/// A loss that can be compared, chosen and drawn; NaN and the infinities are missing.
bool scored(double loss) { return std::isfinite(loss); }

/// The layers of each plan, computed once.
std::vector<int> layer_counts(std::span<const PlanScore> plans) {
  std::vector<int> out;
  out.reserve(plans.size());
  for (const PlanScore& plan : plans) out.push_back(recomputed_layers(plan));
  return out;
}

// ---- SVG text ---------------------------------------------------------------------------------

/// A loss as printed in legends, tick labels and tooltips.
std::string loss_text(double loss) { return fmt::format("{:.3g}", loss); }

/// A <text> element; `attributes` are trusted markup (anchor, size, transform).
std::string svg_text(double x, double y, std::string_view content, std::string_view attributes = {}) {
  return fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\"{}{}>{}</text>\n", x, y, attributes.empty() ? "" : " ",
                     attributes, xml_escape(content));
}

/// A figure's title (16 px, bold) and caption (12 px) above its plot, each wrapped to the figure's width: a
/// title naming two model files is often wider than the figure, and was cut off at both edges.
struct Header {
  static constexpr double kMargin = 12, kTitlePx = 16, kCaptionPx = 12, kTitleLine = 20, kCaptionLine = 16;
  std::string title;
  std::vector<std::string> title_lines, caption_lines;
  Header(double width, std::string_view title_text, std::string_view caption)
      : title(title_text),
        title_lines(wrap_to_width(title_text, kTitlePx, width - 2 * kMargin)),
        caption_lines(wrap_to_width(caption, kCaptionPx, width - 2 * kMargin)) {}
  /// Where the plot starts: 64 px below the top for one line of each, more for each line more.
  double height() const {
    return 64 + kTitleLine * double(title_lines.size() - 1) + kCaptionLine * double(caption_lines.size() - 1);
  }
};

/// The opening of a figure: the root element, a white page, the document title, the title and caption lines.
std::string svg_open(double width, double height, const Header& header) {
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {0:.0f} {1:.0f}\" width=\"{0:.0f}\" "
      "height=\"{1:.0f}\" font-family=\"sans-serif\" font-size=\"12\">\n",
      width, height);
  out += fmt::format("<title>{}</title>\n", xml_escape(header.title));
  out += fmt::format("<rect width=\"{:.0f}\" height=\"{:.0f}\" fill=\"#ffffff\"/>\n", width, height);
  double baseline = 24;
  for (const std::string& line : header.title_lines) {
    out += svg_text(width / 2, baseline, line,
                    "class=\"title\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\"");
    baseline += Header::kTitleLine;
  }
  for (const std::string& line : header.caption_lines) {
    out += svg_text(width / 2, baseline, line, "class=\"caption\" text-anchor=\"middle\" fill=\"#555555\"");
    baseline += Header::kCaptionLine;
  }
  return out;
}

/// The smallest of 1, 2 or 5 times a power of ten that cuts `span` (> 0) into at most `max_ticks` steps.
double tick_step(double span, int max_ticks) {
  const double magnitude = std::pow(10.0, std::floor(std::log10(span / max_ticks)));
  for (double multiple : {1.0, 2.0, 5.0})
    if (span <= max_ticks * multiple * magnitude * (1 + 1e-9)) return multiple * magnitude;
  return 10 * magnitude;
}

/// A tick step over layers 0..n_layers: a whole number of layers.
int layer_tick_step(int n_layers) {
  return std::max(1, static_cast<int>(std::lround(tick_step(n_layers, 10))));
}

/// "partial [10, 15), loss 0.012", or "none".
std::string chosen_text(std::span<const PlanScore> plans, std::span<const double> losses, int n_layers,
                        std::optional<size_t> chosen) {
  if (!chosen) return "none";
  assert(*chosen < plans.size());
  const double loss = losses[*chosen];
  return fmt::format("{}, loss {}", describe_plan(plans[*chosen].ranges, n_layers),
                     scored(loss) ? loss_text(loss) : "missing");
}

// ---- the colour scale -------------------------------------------------------------------------

/// ColorBrewer's YlOrRd: light yellow for the lowest loss through to dark red for the highest.
constexpr std::array<std::array<int, 3>, 5> kScale = {
    {{255, 255, 204}, {254, 217, 118}, {253, 141, 60}, {227, 26, 28}, {128, 0, 38}}};
constexpr std::string_view kMissingColour = "#dddddd";

std::string rgb(const std::array<int, 3>& c) { return fmt::format("#{:02x}{:02x}{:02x}", c[0], c[1], c[2]); }

/// The colour at `t` in [0, 1] along the scale, interpolated between its stops.
std::string scale_colour(double t) {
  const double position = std::clamp(t, 0.0, 1.0) * (kScale.size() - 1);
  const size_t i = std::min(static_cast<size_t>(position), kScale.size() - 2);
  const double f = position - static_cast<double>(i);
  std::array<int, 3> c{};
  for (size_t k = 0; k < 3; ++k)
    c[k] = static_cast<int>(std::lround(kScale[i][k] + f * (kScale[i + 1][k] - kScale[i][k])));
  return rgb(c);
}

/// The smallest and largest of the scored losses added; `any` is false when none was scored.
struct LossBounds {
  double low = std::numeric_limits<double>::infinity(), high = -std::numeric_limits<double>::infinity();
  bool any = false;
  void add(double loss) {
    if (!scored(loss)) return;
    low = std::min(low, loss), high = std::max(high, loss), any = true;
  }
  /// Where `loss` sits between low (0) and high (1); 0 when they are equal.
  double fraction(double loss) const { return high > low ? (loss - low) / (high - low) : 0.0; }
};

// ---- the heatmap --------------------------------------------------------------------------------

/// Where the heatmap's parts go: cells of side cell() in a square plot below the header (`top`), row
/// e = n_layers at the top.
struct HeatmapLayout {
  static constexpr double kLeft = 72, kPlot = 480, kLegend = 150, kBottom = 56;
  static constexpr double kWidth = kLeft + kPlot + kLegend;
  int n_layers;
  double top;
  double cell() const { return kPlot / n_layers; }
  double x(int s) const { return kLeft + s * cell(); }
  double y(int e) const { return top + (n_layers - e) * cell(); }  // the top edge of row e
  double width() const { return kWidth; }
  double height() const { return top + kPlot + kBottom; }
};

/// The single range [s, e) with 0 <= s < e <= n_layers a plan recomputes, if it is one.
std::optional<LayerRange> heatmap_cell(const PlanScore& plan, int n_layers) {
  if (plan.ranges.size() != 1) return std::nullopt;
  const LayerRange r = plan.ranges[0];
  if (r.begin < 0 || r.begin >= r.end || r.end > n_layers) return std::nullopt;
  return r;
}

/// The first plan for each cell, keyed by (s, e).
std::map<std::pair<int, int>, size_t> heatmap_cells(std::span<const PlanScore> plans, int n_layers) {
  std::map<std::pair<int, int>, size_t> out;
  for (size_t i = 0; i < plans.size(); ++i)
    if (auto r = heatmap_cell(plans[i], n_layers)) out.emplace(std::pair{r->begin, r->end}, i);
  return out;
}

std::string heatmap_grid(const HeatmapLayout& at, const std::map<std::pair<int, int>, size_t>& cells,
                         std::span<const PlanScore> plans, std::span<const double> losses,
                         const LossBounds& bounds) {
  std::string out;
  for (int s = 0; s < at.n_layers; ++s) {
    for (int e = s + 1; e <= at.n_layers; ++e) {
      auto found = cells.find({s, e});
      const bool drawn = found != cells.end() && scored(losses[found->second]);
      const std::string fill =
          drawn ? scale_colour(bounds.fraction(losses[found->second])) : std::string(kMissingColour);
      out += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.2f}\" fill=\"{}\">",
                         at.x(s), at.y(e), at.cell(), at.cell(), fill);
      const std::string tip = drawn ? fmt::format("[{}, {}): loss {} over {} items", s, e,
                                                  loss_text(losses[found->second]), plans[found->second].n)
                                    : fmt::format("[{}, {}): not measured", s, e);
      out += fmt::format("<title>{}</title></rect>\n", xml_escape(tip));
    }
  }
  return out;
}

std::string heatmap_axes(const HeatmapLayout& at) {
  std::string out;
  const int step = layer_tick_step(at.n_layers);
  const double below = at.top + HeatmapLayout::kPlot;
  for (int s = 0; s < at.n_layers; s += step)
    out += svg_text(at.x(s) + at.cell() / 2, below + 16, std::to_string(s), "text-anchor=\"middle\"");
  for (int e = 1; e <= at.n_layers; ++e)
    if (e == 1 || e % step == 0)
      out += svg_text(HeatmapLayout::kLeft - 6, at.y(e) + at.cell() / 2 + 4, std::to_string(e),
                      "text-anchor=\"end\"");
  out += svg_text(HeatmapLayout::kLeft + HeatmapLayout::kPlot / 2, below + 40, "first recomputed layer s",
                  "text-anchor=\"middle\"");
  const double label_x = 24, label_y = at.top + HeatmapLayout::kPlot / 2;
  out += svg_text(
      label_x, label_y, "end layer e (exclusive)",
      fmt::format("text-anchor=\"middle\" transform=\"rotate(-90 {:.1f} {:.1f})\"", label_x, label_y));
  return out;
}

/// A vertical bar, low loss at the bottom, with the quality's name above and the min and max beside it.
std::string heatmap_legend(const HeatmapLayout& at, Quality q, const LossBounds& bounds) {
  const double x = HeatmapLayout::kLeft + HeatmapLayout::kPlot + 28, top = at.top + 20, height = 200;
  std::string out = svg_text(x, top - 8, fmt::format("{} loss", quality_name(q)));
  if (!bounds.any) return out + svg_text(x, top + 12, "no scores");
  out += "<defs><linearGradient id=\"reuse-loss-scale\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">";
  for (size_t i = 0; i < kScale.size(); ++i)
    out += fmt::format("<stop offset=\"{:.2f}\" stop-color=\"{}\"/>", double(i) / (kScale.size() - 1),
                       rgb(kScale[i]));
  out += "</linearGradient></defs>\n";
  out += fmt::format(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"16\" height=\"{:.0f}\" fill=\"url(#reuse-loss-scale)\" "
      "stroke=\"#888888\"/>\n",
      x, top, height);
  out += svg_text(x + 22, top + 10, "max " + loss_text(bounds.high));
  out += svg_text(x + 22, top + height, "min " + loss_text(bounds.low));
  out += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"16\" height=\"12\" fill=\"{}\"/>\n", x,
                     top + height + 16, kMissingColour);
  return out + svg_text(x + 22, top + height + 26, "not measured");
}

// ---- the frontier scatter -----------------------------------------------------------------------

/// Where the scatter's parts go: x = recomputed layers 0..n_layers, y = loss low..high upwards, below the
/// header (`top`).
struct ScatterLayout {
  static constexpr double kLeft = 80, kWidth = 520, kHeight = 300, kRight = 32, kBottom = 56;
  static constexpr double kFigureWidth = kLeft + kWidth + kRight;
  int n_layers;
  double low, high, step;  // the loss axis runs from low to high in ticks of step
  double top;
  double x(double layers) const { return kLeft + kWidth * layers / n_layers; }
  double y(double loss) const { return top + kHeight * (1 - (loss - low) / (high - low)); }
  double width() const { return kFigureWidth; }
  double height() const { return top + kHeight + kBottom; }
};

/// The loss axis: from min(0, lowest loss) to the highest, widened to whole ticks, never empty.
ScatterLayout scatter_layout(std::span<const double> losses, int n_layers, double top) {
  LossBounds bounds;
  for (double loss : losses) bounds.add(loss);
  const double low = bounds.any ? std::min(0.0, bounds.low) : 0.0;
  const double high = bounds.any && bounds.high > low ? bounds.high : low + 1;
  const double step = tick_step(high - low, 5);
  return {n_layers, std::floor(low / step + 1e-9) * step, std::ceil(high / step - 1e-9) * step, step, top};
}

std::string loss_axis_label(Quality q) {
  switch (q) {
    case Quality::f1:
      return "f1 loss (1 - token F1 vs recompute)";
    case Quality::kl:
      return "kl loss (KL divergence, nats)";
    case Quality::metric:
      return "metric loss (drop vs recompute)";
  }
  return "loss";
}

std::string scatter_axes(const ScatterLayout& at, Quality q) {
  const double bottom = at.top + ScatterLayout::kHeight;
  std::string out =
      fmt::format("<path d=\"M{0:.1f} {1:.1f} V{2:.1f} H{3:.1f}\" fill=\"none\" stroke=\"#333333\"/>\n",
                  ScatterLayout::kLeft, at.top, bottom, ScatterLayout::kLeft + ScatterLayout::kWidth);
  const int step = layer_tick_step(at.n_layers);
  for (int layers = 0; layers <= at.n_layers; layers += step) {
    out += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#333333\"/>\n",
        at.x(layers), bottom, bottom + 5);
    out += svg_text(at.x(layers), bottom + 18, std::to_string(layers), "text-anchor=\"middle\"");
  }
  const int n_ticks = static_cast<int>(std::lround((at.high - at.low) / at.step));
  for (int k = 0; k <= n_ticks; ++k) {
    const double loss = at.low + k * at.step;
    out += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"#333333\"/>\n",
        ScatterLayout::kLeft - 5, at.y(loss), ScatterLayout::kLeft);
    out += svg_text(ScatterLayout::kLeft - 8, at.y(loss) + 4, loss_text(loss), "text-anchor=\"end\"");
  }
  out += svg_text(ScatterLayout::kLeft + ScatterLayout::kWidth / 2, bottom + 40, "recomputed layers",
                  "text-anchor=\"middle\"");
  const double label_x = 22, label_y = at.top + ScatterLayout::kHeight / 2;
  return out + svg_text(label_x, label_y, loss_axis_label(q),
                        fmt::format("text-anchor=\"middle\" transform=\"rotate(-90 {:.1f} {:.1f})\"", label_x,
                                    label_y));
}

std::string scatter_point(const ScatterLayout& at, int layers, double loss, double radius,
                          std::string_view style, std::string_view tip) {
  return fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{:.1f}\" {}><title>{}</title></circle>\n",
                     at.x(layers), at.y(loss), radius, style, xml_escape(tip));
}

std::string scatter_frontier(const ScatterLayout& at, std::span<const PlanScore> plans,
                             std::span<const double> losses, std::span<const int> layers,
                             std::span<const size_t> frontier) {
  std::string line, points;
  for (size_t i : frontier) {
    assert(i < plans.size());
    if (!scored(losses[i])) continue;
    line += fmt::format("{}{:.1f},{:.1f}", line.empty() ? "" : " ", at.x(layers[i]), at.y(losses[i]));
    points += scatter_point(
        at, layers[i], losses[i], 4, "fill=\"#222222\"",
        fmt::format("{}: loss {}", describe_plan(plans[i].ranges, at.n_layers), loss_text(losses[i])));
  }
  if (line.empty()) return {};
  return fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"#222222\" stroke-width=\"1.5\"/>\n",
                     line) +
         points;
}

}  // namespace

int recomputed_layers(const PlanScore& plan) {
  int total = 0;
  for (const LayerRange& r : plan.ranges) total += r.end - r.begin;
  return total;
}

std::string describe_plan(std::span<const LayerRange> ranges, int n_layers) {
  if (ranges.empty()) return "reuse";
  if (ranges.size() == 1 && ranges[0].begin == 0 && ranges[0].end == n_layers) return "recompute";
  std::string out = "partial";
  for (const LayerRange& r : ranges) out += fmt::format(" [{}, {})", r.begin, r.end);
  return out;
}

std::string_view quality_name(Quality q) { return kQualityNames[static_cast<size_t>(q)]; }

Quality parse_quality(std::string_view name) {
  return static_cast<Quality>(index_of_name(name, kQualityNames, "quality", "qualities"));
}

double quality_loss(Quality q, const PlanScore& plan, const PlanScore& recompute) {
  // A plan (or a reference) scored on no item has no loss to give: its means are the zeros they started as.
  if (plan.n == 0 || recompute.n == 0) return std::numeric_limits<double>::quiet_NaN();
  switch (q) {
    case Quality::f1:
      return 1 - plan.token_f1;
    case Quality::kl:
      return plan.kl;
    case Quality::metric: {
      const double drop = recompute.metric - plan.metric;
      return drop < 0 ? 0.0 : drop;  // a NaN drop stays NaN (missing), where std::max would hide it
    }
  }
  return std::numeric_limits<double>::quiet_NaN();
}

std::vector<size_t> pareto_frontier(std::span<const PlanScore> plans, std::span<const double> losses) {
  assert(plans.size() == losses.size());
  const std::vector<int> layers = layer_counts(plans);
  std::vector<size_t> order;
  for (size_t i = 0; i < plans.size(); ++i)
    if (scored(losses[i])) order.push_back(i);
  // Cheapest first, then lowest loss, then first given: each plan is dominated exactly when a plan before it
  // has a loss at most its own, so one pass keeping the best loss so far finds the frontier.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return layers[a] != layers[b] ? layers[a] < layers[b] : losses[a] < losses[b];
  });
  std::vector<size_t> frontier;
  double best = std::numeric_limits<double>::infinity();
  for (size_t i : order) {
    if (losses[i] >= best) continue;
    frontier.push_back(i);
    best = losses[i];
  }
  return frontier;
}

std::optional<size_t> choose_plan(std::span<const PlanScore> plans, std::span<const double> losses,
                                  double max_loss) {
  assert(plans.size() == losses.size());
  std::optional<size_t> best;
  int best_layers = 0;
  for (size_t i = 0; i < plans.size(); ++i) {
    if (!scored(losses[i]) || !(losses[i] <= max_loss)) continue;
    const int layers = recomputed_layers(plans[i]);
    if (best && (layers > best_layers || (layers == best_layers && losses[i] >= losses[*best]))) continue;
    best = i;
    best_layers = layers;
  }
  return best;
}

std::string heatmap_svg(std::span<const PlanScore> plans, std::span<const double> losses, int n_layers,
                        Quality q, std::optional<size_t> chosen, std::string_view title) {
  assert(plans.size() == losses.size() && n_layers > 0);
  const Header header(HeatmapLayout::kWidth, title,
                      "chosen: " + chosen_text(plans, losses, n_layers, chosen));
  const HeatmapLayout at{n_layers, header.height()};
  const auto cells = heatmap_cells(plans, n_layers);
  LossBounds bounds;
  for (const auto& [cell, i] : cells) bounds.add(losses[i]);
  std::string out = svg_open(at.width(), at.height(), header);
  out += heatmap_grid(at, cells, plans, losses, bounds);
  if (chosen)
    if (auto r = heatmap_cell(plans[*chosen], n_layers))
      out += fmt::format(
          "<rect class=\"chosen\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.2f}\" fill=\"none\" "
          "stroke=\"#000000\" stroke-width=\"2.5\"/>\n",
          at.x(r->begin), at.y(r->end), at.cell(), at.cell());
  out += heatmap_axes(at);
  out += heatmap_legend(at, q, bounds);
  return out + "</svg>\n";
}

std::string frontier_svg(std::span<const PlanScore> plans, std::span<const double> losses,
                         std::span<const size_t> frontier, int n_layers, Quality q,
                         std::optional<size_t> chosen, std::string_view title) {
  assert(plans.size() == losses.size() && n_layers > 0);
  const Header header(ScatterLayout::kFigureWidth, title,
                      "grey: every plan; dark: Pareto frontier; red ring: chosen " +
                          chosen_text(plans, losses, n_layers, chosen));
  const ScatterLayout at = scatter_layout(losses, n_layers, header.height());
  const std::vector<int> layers = layer_counts(plans);
  std::string out = svg_open(at.width(), at.height(), header);
  out += scatter_axes(at, q);
  for (size_t i = 0; i < plans.size(); ++i)
    if (scored(losses[i]))
      out += scatter_point(
          at, layers[i], losses[i], 3, "fill=\"#bbbbbb\"",
          fmt::format("{}: loss {}", describe_plan(plans[i].ranges, n_layers), loss_text(losses[i])));
  out += scatter_frontier(at, plans, losses, layers, frontier);
  if (chosen && scored(losses[*chosen]))
    out += scatter_point(at, layers[*chosen], losses[*chosen], 8,
                         "class=\"chosen\" fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\"", "chosen");
  return out + "</svg>\n";
}

nlohmann::ordered_json plans_json(std::span<const PlanScore> plans, std::span<const double> losses,
                                  int n_layers) {
  assert(plans.size() == losses.size());
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (size_t i = 0; i < plans.size(); ++i) {
    const PlanScore& plan = plans[i];
    nlohmann::ordered_json ranges = nlohmann::ordered_json::array();
    for (const LayerRange& r : plan.ranges) ranges.push_back(nlohmann::ordered_json::array({r.begin, r.end}));
    out.push_back(
        {{"plan", describe_plan(plan.ranges, n_layers)},
         {"ranges", std::move(ranges)},
         {"recomputed_layers", recomputed_layers(plan)},
         {"token_f1", plan.token_f1},
         {"kl", plan.kl},
         {"metric", plan.metric},
         {"prefill_ms", plan.prefill_ms},
         {"n", plan.n},
         {"loss", scored(losses[i]) ? nlohmann::ordered_json(losses[i]) : nlohmann::ordered_json()}});
  }
  return out;
}

}  // namespace choreo::eval
