// The cross-model reuse report (runtime/eval/reuse_report.h): the frontier agrees with a brute-force one on
// random plans, the chosen plan is the cheapest within the budget, losses follow each quality's definition,
// and the figures are well-formed XML (parsed by the PML reader) whatever the title or the losses hold.

#include "runtime/eval/reuse_report.h"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "common/error.h"
#include "dsl/pml/xml.h"

namespace choreo::eval {
namespace {

using dsl::pml::XmlElement;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

PlanScore plan(std::vector<LayerRange> ranges, int n = 4) {
  PlanScore p;
  p.ranges = std::move(ranges);
  p.n = n;
  return p;
}

/// Every element of the tree, in document order.
void collect(const XmlElement& e, std::vector<const XmlElement*>& out) {
  out.push_back(&e);
  for (const auto& child : e.children)
    if (!child.is_text) collect(child.element, out);
}

/// The parsed figure (read_xml throws on anything that is not well-formed) and its elements.
struct Figure {
  dsl::pml::XmlDocument doc;
  std::vector<const XmlElement*> elements;
  explicit Figure(const std::string& svg) : doc(dsl::pml::read_xml(svg, {"figure.svg", 1, 1})) {
    collect(doc.root, elements);
  }
  std::vector<const XmlElement*> named(std::string_view name) const {
    std::vector<const XmlElement*> out;
    for (const XmlElement* e : elements)
      if (e->name == name) out.push_back(e);
    return out;
  }
};

std::string attr(const XmlElement& e, std::string_view name) {
  const auto* a = e.attribute(name);
  return a ? a->value : "";
}

/// The decoded text directly inside `e`.
std::string text_of(const XmlElement& e) {
  std::string out;
  for (const auto& child : e.children)
    if (child.is_text) out += dsl::pml::decode_entities(child.text.raw);
  return out;
}

/// The text of the <title> child of `e`, or "".
std::string tooltip(const XmlElement& e) {
  for (const auto& child : e.children)
    if (!child.is_text && child.element.name == "title") return text_of(child.element);
  return "";
}

/// Brute force, straight from the definition: i is on the frontier unless some j is no worse in both and
/// better in one, or an earlier j ties it exactly.
std::vector<size_t> brute_frontier(const std::vector<PlanScore>& plans, const std::vector<double>& losses) {
  std::vector<size_t> out;
  for (size_t i = 0; i < plans.size(); ++i) {
    if (!std::isfinite(losses[i])) continue;
    const int li = recomputed_layers(plans[i]);
    bool beaten = false;
    for (size_t j = 0; j < plans.size() && !beaten; ++j) {
      if (j == i || !std::isfinite(losses[j])) continue;
      const int lj = recomputed_layers(plans[j]);
      const bool no_worse = lj <= li && losses[j] <= losses[i];
      const bool better = lj < li || losses[j] < losses[i];
      beaten = (no_worse && better) || (j < i && lj == li && losses[j] == losses[i]);
    }
    if (!beaten) out.push_back(i);
  }
  std::stable_sort(out.begin(), out.end(), [&](size_t a, size_t b) {
    return recomputed_layers(plans[a]) < recomputed_layers(plans[b]);
  });
  return out;
}

/// Random single- and multi-range plans over `n_layers` with losses on a coarse grid (many ties), some
/// missing.
void random_plans(std::mt19937& rng, int n_layers, std::vector<PlanScore>& plans,
                  std::vector<double>& losses) {
  std::uniform_int_distribution<int> count(0, 12), layer(0, n_layers - 1), grid(0, 5), kind(0, 9);
  plans.clear(), losses.clear();
  const int n = count(rng);
  for (int k = 0; k < n; ++k) {
    std::vector<LayerRange> ranges;
    const int pieces = kind(rng) < 2 ? 0 : kind(rng) < 8 ? 1 : 2;
    for (int r = 0; r < pieces; ++r) {
      const int a = layer(rng), b = layer(rng);
      ranges.push_back({std::min(a, b), std::max(a, b) + 1});
    }
    plans.push_back(plan(ranges));
    const int roll = kind(rng);
    losses.push_back(roll == 0 ? kNaN : roll == 1 ? kInf : grid(rng) * 0.1);
  }
}

/// Reuse, a two-range plan, every other single-range plan over 6 layers and recompute, with losses that fall
/// as more layers are recomputed.
void sweep(std::vector<PlanScore>& plans, std::vector<double>& losses) {
  const int n_layers = 6;
  plans = {plan({}), plan({{1, 2}, {4, 5}})};
  losses = {0.9, 0.5};
  for (int s = 0; s < n_layers; ++s)
    for (int e = s + 1; e <= n_layers; e += 2) {
      plans.push_back(plan({{s, e}}));
      losses.push_back(0.8 - 0.1 * (e - s) - 0.01 * s);
    }
  plans.push_back(plan({{0, n_layers}}));
  losses.push_back(0);
}

TEST_CASE(
    "reuse report: recomputed_layers sums the ranges and describe_plan names reuse, recompute and partials") {
  CHECK(recomputed_layers(plan({})) == 0);
  CHECK(recomputed_layers(plan({{10, 15}})) == 5);
  CHECK(recomputed_layers(plan({{3, 4}, {7, 9}})) == 3);
  const std::vector<LayerRange> none, all = {{0, 32}}, one = {{10, 15}}, two = {{3, 4}, {7, 8}},
                                      most = {{0, 31}};
  CHECK(describe_plan(none, 32) == "reuse");
  CHECK(describe_plan(all, 32) == "recompute");
  CHECK(describe_plan(all, 40) == "partial [0, 32)");
  CHECK(describe_plan(most, 32) == "partial [0, 31)");
  CHECK(describe_plan(one, 32) == "partial [10, 15)");
  CHECK(describe_plan(two, 32) == "partial [3, 4) [7, 8)");
}

TEST_CASE("reuse report: parse_quality reads every name and rejects others with a hint listing the names") {
  for (Quality q : {Quality::f1, Quality::kl, Quality::metric}) CHECK(parse_quality(quality_name(q)) == q);
  CHECK(quality_name(Quality::kl) == "kl");
  try {
    parse_quality("kll");
    FAIL("no error");
  } catch (const InputError& e) {
    CHECK(e.message().find("kll") != std::string::npos);
    CHECK(e.message().find("did you mean 'kl'") != std::string::npos);
    for (const char* name : {"f1", "kl", "metric"}) CHECK(e.hint().find(name) != std::string::npos);
  }
  CHECK_THROWS_AS(parse_quality(""), InputError);
  CHECK_THROWS_AS(parse_quality("F1"), InputError);
}

TEST_CASE("reuse report: quality_loss is 1 - token F1, the KL, or the metric's drop below recompute") {
  PlanScore recompute = plan({{0, 8}}), partial = plan({{2, 4}});
  recompute.metric = 0.6;
  partial.token_f1 = 0.75, partial.kl = 0.125, partial.metric = 0.45;
  CHECK(quality_loss(Quality::f1, partial, recompute) == doctest::Approx(0.25));
  CHECK(quality_loss(Quality::kl, partial, recompute) == 0.125);
  CHECK(quality_loss(Quality::metric, partial, recompute) == doctest::Approx(0.15));
  partial.metric = 0.7;  // better than recompute: no loss, not a negative one
  CHECK(quality_loss(Quality::metric, partial, recompute) == 0.0);
  partial.metric = kNaN;
  CHECK(std::isnan(quality_loss(Quality::metric, partial, recompute)));
  recompute.token_f1 = 1;  // recompute's own F1 against itself
  CHECK(quality_loss(Quality::f1, recompute, recompute) == 0.0);
  // Scored on no item: no loss at all (not 1 - 0 for f1, not 0 for kl), under every quality.
  for (Quality q : {Quality::f1, Quality::kl, Quality::metric}) {
    CHECK(std::isnan(quality_loss(q, plan({{2, 4}}, 0), recompute)));
    CHECK(std::isnan(quality_loss(q, partial, plan({{0, 8}}, 0))));
  }
}

TEST_CASE("reuse report: pareto_frontier matches a brute-force frontier on random plans") {
  std::mt19937 rng(20261);
  std::vector<PlanScore> plans;
  std::vector<double> losses;
  size_t longest = 0;
  for (int round = 0; round < 2000; ++round) {
    random_plans(rng, 1 + round % 12, plans, losses);
    const std::vector<size_t> expected = brute_frontier(plans, losses);
    const std::vector<size_t> got = pareto_frontier(plans, losses);
    REQUIRE(got == expected);
    longest = std::max(longest, got.size());
    // Along the frontier layers rise and losses fall, strictly.
    for (size_t k = 1; k < got.size(); ++k) {
      CHECK(recomputed_layers(plans[got[k - 1]]) < recomputed_layers(plans[got[k]]));
      CHECK(losses[got[k - 1]] > losses[got[k]]);
    }
  }
  CHECK(longest >= 3);  // not vacuous
}

TEST_CASE("reuse report: pareto_frontier keeps the first of exact ties and drops missing losses") {
  const std::vector<PlanScore> plans = {plan({}),       plan({{0, 2}}), plan({{2, 4}}),
                                        plan({{1, 2}}), plan({{5, 6}}), plan({{0, 4}})};
  const std::vector<double> losses = {kNaN, 0.3, 0.3, 0.5, 0.5, 0.0};
  // [1, 2) and [5, 6) tie at 1 layer: keep [1, 2). [0, 2) and [2, 4) tie at 2 layers: keep [0, 2).
  CHECK(pareto_frontier(plans, losses) == std::vector<size_t>{3, 1, 5});
  CHECK(pareto_frontier({}, {}).empty());
}

TEST_CASE(
    "reuse report: choose_plan picks the fewest layers within max_loss, then the lowest loss, then the "
    "first") {
  const std::vector<PlanScore> plans = {plan({}),       plan({{4, 6}}), plan({{0, 2}}), plan({{1, 3}}),
                                        plan({{0, 5}}), plan({{0, 8}}), plan({{2, 3}})};
  const std::vector<double> losses = {0.40, 0.10, 0.05, 0.05, 0.02, 0.0, kNaN};
  CHECK(choose_plan(plans, losses, 0.5) == 0u);   // reuse is free
  CHECK(choose_plan(plans, losses, 0.1) == 2u);   // 2 layers; [0, 2) beats [4, 6) on loss and [1, 3) by order
  CHECK(choose_plan(plans, losses, 0.05) == 2u);  // the bound is inclusive
  CHECK(choose_plan(plans, losses, 0.03) == 4u);
  CHECK(choose_plan(plans, losses, 0.0) == 5u);
  CHECK(choose_plan(plans, losses, -0.01) == std::nullopt);  // nothing within the budget
  CHECK(choose_plan(plans, losses, kNaN) == std::nullopt);
  CHECK(choose_plan({}, {}, 1.0) == std::nullopt);
  // A missing loss is never chosen, even when it would be cheapest.
  const std::vector<double> missing = {kNaN, kInf, 0.2, 0.2, 0.2, 0.2, 0.2};
  CHECK(choose_plan(plans, missing, kInf) == 6u);  // [2, 3), one layer
}

TEST_CASE("reuse report: the chosen plan lies on the frontier and no cheaper plan is within the budget") {
  std::mt19937 rng(7);
  std::vector<PlanScore> plans;
  std::vector<double> losses;
  int chosen_count = 0;
  for (int round = 0; round < 1000; ++round) {
    random_plans(rng, 8, plans, losses);
    const double max_loss = 0.1 * (round % 6);
    const std::optional<size_t> chosen = choose_plan(plans, losses, max_loss);
    const std::vector<size_t> frontier = pareto_frontier(plans, losses);
    if (!chosen) {
      for (double loss : losses) CHECK_FALSE((std::isfinite(loss) && loss <= max_loss));
      continue;
    }
    ++chosen_count;
    CHECK(losses[*chosen] <= max_loss);
    CHECK(std::find(frontier.begin(), frontier.end(), *chosen) != frontier.end());
    for (size_t i = 0; i < plans.size(); ++i)
      if (std::isfinite(losses[i]) && losses[i] <= max_loss)
        CHECK(recomputed_layers(plans[i]) >= recomputed_layers(plans[*chosen]));
  }
  CHECK(chosen_count > 100);  // not vacuous
}

TEST_CASE(
    "reuse report: the heatmap has one coloured cell per single-range plan and outlines the chosen one") {
  std::vector<PlanScore> plans;
  std::vector<double> losses;
  sweep(plans, losses);
  const size_t chosen = 5;  // a single-range plan
  REQUIRE(plans[chosen].ranges.size() == 1);
  const Figure figure(heatmap_svg(plans, losses, 6, Quality::kl, chosen, "kl & friends"));
  CHECK(figure.doc.root.name == "svg");
  CHECK(!attr(figure.doc.root, "viewBox").empty());
  CHECK(figure.named("script").empty());

  // Every cell s < e is a rect with a tooltip naming it; the measured ones are coloured, the others grey.
  int measured = 0, blank = 0;
  const XmlElement* chosen_cell = nullptr;
  const std::string chosen_name =
      fmt::format("[{}, {})", plans[chosen].ranges[0].begin, plans[chosen].ranges[0].end);
  for (const XmlElement* rect : figure.named("rect")) {
    const std::string tip = tooltip(*rect);
    if (tip.empty()) continue;
    (tip.find("not measured") != std::string::npos ? blank : measured)++;
    if (tip.rfind(chosen_name + ":", 0) == 0) chosen_cell = rect;
  }
  const auto cells =
      std::count_if(plans.begin(), plans.end(), [](const PlanScore& p) { return p.ranges.size() == 1; });
  CHECK(measured == cells);
  CHECK(blank == 6 * 7 / 2 - cells);
  CHECK(blank > 0);  // not vacuous: some cells are grey
  REQUIRE(chosen_cell != nullptr);

  // Exactly one outline, over the chosen plan's cell.
  const auto outlined = std::count_if(figure.elements.begin(), figure.elements.end(),
                                      [](const XmlElement* e) { return attr(*e, "class") == "chosen"; });
  CHECK(outlined == 1);
  for (const XmlElement* rect : figure.named("rect")) {
    if (attr(*rect, "class") != "chosen") continue;
    for (const char* key : {"x", "y", "width", "height"}) CHECK(attr(*rect, key) == attr(*chosen_cell, key));
    CHECK(attr(*rect, "fill") == "none");
  }

  // The legend names the quality and gives the min and max of the cells' losses (reuse's 0.9 is not a cell).
  std::string all_text;
  for (const XmlElement* text : figure.named("text")) all_text += text_of(*text) + "\n";
  CHECK(all_text.find("kl loss") != std::string::npos);
  CHECK(all_text.find("kl & friends") != std::string::npos);
  CHECK(all_text.find("max 0.7") != std::string::npos);  // [s, s+1) for s = 0
  CHECK(all_text.find("min 0") != std::string::npos);    // recompute, [0, 6)
  CHECK(all_text.find("max 0.9") == std::string::npos);
}

TEST_CASE(
    "reuse report: the heatmap leaves out reuse and multi-range plans and names a chosen one in the "
    "caption") {
  const std::vector<PlanScore> plans = {plan({}), plan({{0, 1}, {2, 3}}), plan({{1, 3}})};
  const std::vector<double> losses = {0.5, 0.2, 0.1};
  const Figure figure(heatmap_svg(plans, losses, 3, Quality::f1, 1, "t"));
  int measured = 0;
  for (const XmlElement* rect : figure.named("rect"))
    if (!tooltip(*rect).empty() && tooltip(*rect).find("not measured") == std::string::npos) ++measured;
  CHECK(measured == 1);
  for (const XmlElement* e : figure.elements) CHECK(attr(*e, "class") != "chosen");
  std::string all_text;
  for (const XmlElement* text : figure.named("text")) all_text += text_of(*text) + "\n";
  CHECK(all_text.find("chosen: partial [0, 1) [2, 3)") != std::string::npos);
}

TEST_CASE("reuse report: NaN and infinite losses leave no nan or inf in the figures and count as missing") {
  std::vector<PlanScore> plans;
  std::vector<double> losses;
  sweep(plans, losses);
  losses[2] = kNaN, losses[3] = kInf, losses[4] = -kInf;
  const std::vector<size_t> frontier = pareto_frontier(plans, losses);
  const std::optional<size_t> chosen = 2;  // a caller may still ask for a plan whose loss is missing
  for (const std::string& svg : {heatmap_svg(plans, losses, 6, Quality::metric, chosen, "t"),
                                 frontier_svg(plans, losses, frontier, 6, Quality::metric, chosen, "t")}) {
    std::string lower = svg;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    CHECK(lower.find("nan") == std::string::npos);
    CHECK(lower.find("inf") == std::string::npos);
    CHECK_NOTHROW(Figure{svg});
  }
  int measured = 0;
  const Figure heatmap(heatmap_svg(plans, losses, 6, Quality::metric, chosen, "t"));
  for (const XmlElement* rect : heatmap.named("rect"))
    if (!tooltip(*rect).empty() && tooltip(*rect).find("not measured") == std::string::npos) ++measured;
  const auto cells =
      std::count_if(plans.begin(), plans.end(), [](const PlanScore& p) { return p.ranges.size() == 1; });
  CHECK(measured == cells - 3);
  // All losses missing: still a figure, with no legend range.
  const std::vector<double> none(plans.size(), kNaN);
  CHECK_NOTHROW(Figure{heatmap_svg(plans, none, 6, Quality::kl, std::nullopt, "t")});
  CHECK_NOTHROW(Figure{frontier_svg(plans, none, {}, 6, Quality::kl, std::nullopt, "t")});
}

TEST_CASE("reuse report: titles with XML's special characters come through escaped and intact") {
  const std::string title = "<sender> & \"receiver\" 's \x01 run</svg>";
  const std::vector<PlanScore> plans = {plan({}), plan({{0, 2}})};
  const std::vector<double> losses = {0.4, 0.0};
  for (const std::string& svg :
       {heatmap_svg(plans, losses, 2, Quality::f1, 1, title),
        frontier_svg(plans, losses, std::vector<size_t>{0, 1}, 2, Quality::f1, 1, title)}) {
    const Figure figure(svg);
    const auto titles = figure.named("title");
    REQUIRE(!titles.empty());
    CHECK(text_of(*titles[0]) == "<sender> & \"receiver\" 's   run</svg>");
  }
}

TEST_CASE(
    "reuse report: the frontier scatter draws every scored plan, joins the frontier and rings the chosen "
    "plan") {
  std::vector<PlanScore> plans;
  std::vector<double> losses;
  sweep(plans, losses);
  losses[3] = kNaN;
  const std::vector<size_t> frontier = pareto_frontier(plans, losses);
  REQUIRE(frontier.size() >= 3);
  const std::optional<size_t> chosen = choose_plan(plans, losses, 0.35);
  REQUIRE(chosen);
  const Figure figure(frontier_svg(plans, losses, frontier, 6, Quality::f1, chosen, "frontier"));
  CHECK(!attr(figure.doc.root, "viewBox").empty());

  int grey = 0, dark = 0, ringed = 0;
  for (const XmlElement* circle : figure.named("circle")) {
    if (attr(*circle, "class") == "chosen")
      ++ringed;
    else if (attr(*circle, "fill") == "#bbbbbb")
      ++grey;
    else
      ++dark;
  }
  CHECK(grey == static_cast<int>(plans.size()) - 1);
  CHECK(dark == static_cast<int>(frontier.size()));
  CHECK(ringed == 1);

  const auto lines = figure.named("polyline");
  REQUIRE(lines.size() == 1);
  const std::string points = attr(*lines[0], "points");
  CHECK(std::count(points.begin(), points.end(), ',') == static_cast<long>(frontier.size()));

  // The ring sits on the chosen plan's point, which is a frontier point.
  const XmlElement* ring = nullptr;
  for (const XmlElement* circle : figure.named("circle"))
    if (attr(*circle, "class") == "chosen") ring = circle;
  REQUIRE(ring != nullptr);
  bool on_dark_point = false;
  for (const XmlElement* circle : figure.named("circle"))
    if (attr(*circle, "fill") != "#bbbbbb" && circle != ring)
      on_dark_point |= attr(*circle, "cx") == attr(*ring, "cx") && attr(*circle, "cy") == attr(*ring, "cy");
  CHECK(on_dark_point);

  std::string all_text;
  for (const XmlElement* text : figure.named("text")) all_text += text_of(*text) + "\n";
  CHECK(all_text.find("recomputed layers") != std::string::npos);
  CHECK(all_text.find("f1 loss") != std::string::npos);
}

TEST_CASE("reuse report: plans_json gives each plan's name, ranges, scores and loss, null when missing") {
  PlanScore partial = plan({{3, 4}, {7, 9}}, 12);
  partial.token_f1 = 0.5, partial.kl = 0.25, partial.metric = 0.75, partial.prefill_ms = 42.5;
  const std::vector<PlanScore> plans = {plan({}), partial, plan({{0, 10}})};
  const std::vector<double> losses = {kNaN, 0.5, 0.0};
  const nlohmann::ordered_json json = plans_json(plans, losses, 10);
  REQUIRE(json.size() == 3);
  CHECK(json[0]["plan"] == "reuse");
  CHECK(json[0]["ranges"] == nlohmann::ordered_json::array());
  CHECK(json[0]["loss"].is_null());
  CHECK(json[2]["plan"] == "recompute");
  const auto& p = json[1];
  std::vector<std::string> keys;
  for (const auto& [key, value] : p.items()) keys.push_back(key);
  CHECK(keys == std::vector<std::string>{"plan", "ranges", "recomputed_layers", "token_f1", "kl", "metric",
                                         "prefill_ms", "n", "loss"});
  CHECK(p["plan"] == "partial [3, 4) [7, 9)");
  CHECK(p["ranges"] == nlohmann::ordered_json::parse("[[3, 4], [7, 9]]"));
  CHECK(p["recomputed_layers"] == 3);
  CHECK(p["token_f1"] == 0.5);
  CHECK(p["kl"] == 0.25);
  CHECK(p["metric"] == 0.75);
  CHECK(p["prefill_ms"] == 42.5);
  CHECK(p["n"] == 12);
  CHECK(p["loss"] == 0.5);
  CHECK(json.dump().find("NaN") == std::string::npos);
}

}  // namespace
}  // namespace choreo::eval
