// The pictures of `profile reuse` (heatmap.svg, frontier.svg) as a person sees them: rendered to PNG by
// rsvg-convert (librsvg, as image viewers and browsers on Debian draw SVG), nothing drawn falls outside the
// figure, and a title naming two long model files wraps onto more lines instead (issue 42, finding 12: the
// title was cut off at both edges). The wrapping is also checked on the SVG's text: the title's lines are
// estimated to fit, and together hold every word of the title.

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <png.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "dsl/pml/xml.h"
#include "runtime/eval/reuse_report.h"
#include "runtime/eval/svg_fit.h"
#include "tests/cli_process.h"
#include "tests/scratch_dir.h"

namespace choreo::eval {
namespace {

namespace fs = std::filesystem;

// The title `profile reuse` wrote for the shared math adapter: wider than either figure on one line.
const std::string kLongTitle =
    "smollm2-135m-instruct-math-lora.gguf reading default: f1 loss, 3 training items";

/// A small sweep over 6 layers: reuse, recompute and every single range, with losses falling as more is
/// recomputed.
void sweep(std::vector<PlanScore>& plans, std::vector<double>& losses) {
  plans.push_back({});
  losses.push_back(0.9);
  for (int s = 0; s < 6; ++s)
    for (int e = s + 1; e <= 6; ++e) {
      PlanScore p;
      p.ranges = {{s, e}};
      p.n = 3;
      plans.push_back(p);
      losses.push_back(0.9 * (1 - double(e - s) / 6));
    }
}

/// The figure's header as its SVG text says: the title's and the caption's lines (<text class="title"> and
/// class="caption"), and the figure's width (the root's width attribute).
struct HeaderText {
  std::vector<std::string> title, caption;
  double width = 0;
};

HeaderText header_text(const std::string& svg) {
  const dsl::pml::XmlDocument doc = dsl::pml::read_xml(svg, {"figure.svg", 1, 1});
  HeaderText out;
  out.width = std::stod(doc.root.attribute("width")->value);
  for (const dsl::pml::XmlNode& child : doc.root.children) {
    if (child.is_text || child.element.name != "text") continue;
    const dsl::pml::XmlAttribute* cls = child.element.attribute("class");
    if (!cls || (cls->value != "title" && cls->value != "caption")) continue;
    std::string line;
    for (const dsl::pml::XmlNode& t : child.element.children)
      if (t.is_text) line += dsl::pml::decode_entities(t.text.raw);
    (cls->value == "title" ? out.title : out.caption).push_back(line);
  }
  return out;
}

std::vector<std::string> words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

/// An RGBA picture decoded by libpng.
struct Picture {
  uint32_t width = 0, height = 0;
  std::vector<uint8_t> rgba;
  const uint8_t* at(uint32_t x, uint32_t y) const { return &rgba[(size_t(y) * width + x) * 4]; }
};

Picture read_png(const fs::path& path) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  REQUIRE_MESSAGE(png_image_begin_read_from_file(&image, path.c_str()) != 0, image.message);
  image.format = PNG_FORMAT_RGBA;
  Picture p{image.width, image.height, std::vector<uint8_t>(PNG_IMAGE_SIZE(image))};
  REQUIRE_MESSAGE(png_image_finish_read(&image, nullptr, p.rgba.data(), 0, nullptr) != 0, image.message);
  return p;
}

/// `svg` rendered by rsvg-convert on a canvas `margin` px larger on every side than the figure, so that
/// whatever the figure draws outside itself (and a viewer would cut off) shows on the canvas.
Picture render_with_margin(const std::string& svg, double margin, const testing::ScratchDir& dir) {
  const std::regex root(R"re(viewBox="0 0 ([0-9.]+) ([0-9.]+)" width="[0-9.]+" height="[0-9.]+")re");
  std::smatch m;
  REQUIRE(std::regex_search(svg, m, root));
  const double w = std::stod(m[1]), h = std::stod(m[2]);
  const std::string widened =
      std::regex_replace(svg, root,
                         fmt::format("viewBox=\"{0} {0} {1} {2}\" width=\"{1}\" height=\"{2}\"", -margin,
                                     w + 2 * margin, h + 2 * margin),
                         std::regex_constants::format_first_only);
  const fs::path in = dir.path / "figure.svg", out = dir.path / "figure.png";
  std::ofstream(in) << widened;
  const char* rsvg = "/usr/bin/rsvg-convert";
  REQUIRE_MESSAGE(fs::exists(rsvg), "rsvg-convert is missing: install librsvg2-bin (scripts/setup.sh does)");
  const testing::ProcessResult r = testing::run_process(rsvg, {"-f", "png", "-o", out.string(), in.string()},
                                                        dir.path, {.timeout_seconds = 60});
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  return read_png(out);
}

/// Pixels drawn (not transparent) outside the figure's rectangle, which starts `margin` px into the canvas.
int drawn_outside(const Picture& p, uint32_t margin) {
  int n = 0;
  for (uint32_t y = 0; y < p.height; ++y)
    for (uint32_t x = 0; x < p.width; ++x) {
      const bool inside = x >= margin && x < p.width - margin && y >= margin && y < p.height - margin;
      if (!inside && p.at(x, y)[3] > 0) ++n;
    }
  return n;
}

/// The separate runs of rows, in the figure's top `band` px, that hold dark pixels (text): one per line.
int text_rows(const Picture& p, uint32_t margin, uint32_t band) {
  int runs = 0;
  bool in_run = false;
  for (uint32_t y = margin; y < margin + band; ++y) {
    bool dark = false;
    for (uint32_t x = margin; x < p.width - margin && !dark; ++x) {
      const uint8_t* c = p.at(x, y);
      dark = c[3] > 0 && c[0] < 128 && c[1] < 128 && c[2] < 128;
    }
    runs += dark && !in_run;
    in_run = dark;
  }
  return runs;
}

TEST_CASE(
    "reuse figures: a title wider than the figure wraps, and as rsvg-convert draws them nothing is cut off") {
  std::vector<PlanScore> plans;
  std::vector<double> losses;
  sweep(plans, losses);
  const std::vector<size_t> frontier = pareto_frontier(plans, losses);
  const std::optional<size_t> chosen = choose_plan(plans, losses, 0.4);
  testing::ScratchDir dir;
  constexpr uint32_t kMargin = 200;
  for (const auto& [name, svg] :
       {std::pair<std::string, std::string>{"heatmap",
                                            heatmap_svg(plans, losses, 6, Quality::f1, chosen, kLongTitle)},
        {"frontier", frontier_svg(plans, losses, frontier, 6, Quality::f1, chosen, kLongTitle)}}) {
    CAPTURE(name);
    // The SVG's text: more than one line, each estimated to fit, every word of the title in order.
    const HeaderText header = header_text(svg);
    CHECK(header.title.size() >= 2);
    REQUIRE(!header.caption.empty());
    std::string joined;
    for (const std::string& line : header.title) {
      CHECK(estimated_text_width_px(line, 16) <= header.width - 24);
      joined += (joined.empty() ? "" : " ") + line;
    }
    CHECK(words(joined) == words(kLongTitle));
    for (const std::string& line : header.caption)
      CHECK(estimated_text_width_px(line, 12) <= header.width - 24);

    // The picture: nothing outside the figure, and each line of the header is a separate row of ink. The plot
    // starts 20 px below the caption's last baseline; its top tick label reaches 5 px above it.
    const Picture picture = render_with_margin(svg, kMargin, dir);
    CHECK(drawn_outside(picture, kMargin) == 0);
    const uint32_t plot_top =
        64 + 20 * uint32_t(header.title.size() - 1) + 16 * uint32_t(header.caption.size() - 1);
    CHECK(text_rows(picture, kMargin, plot_top - 10) == int(header.title.size() + header.caption.size()));
  }
}

TEST_CASE(
    "reuse figures: a short title stays one line, and a word wider than a line is cut between characters") {
  CHECK(wrap_to_width("qwen reading default: kl loss, 8 training items", 16, 678) ==
        std::vector<std::string>{"qwen reading default: kl loss, 8 training items"});
  CHECK(wrap_to_width("", 16, 100) == std::vector<std::string>{""});
  const std::string word(60, 'x');
  const std::vector<std::string> cut = wrap_to_width("a " + word + " b", 16, 200);
  std::string rejoined;
  for (const std::string& line : cut) {
    CHECK(estimated_text_width_px(line, 16) <= 200);
    for (const char c : line)
      if (c != ' ') rejoined += c;
  }
  CHECK(cut.size() >= 3);
  CHECK(rejoined == "a" + word + "b");  // every character, in order
  // Multi-byte characters are never split.
  const std::vector<std::string> accents =
      wrap_to_width(std::string(40, ' ') + "ééééééééééééééééééééé", 12, 60);
  for (const std::string& line : accents) CHECK(line.size() % 2 == 0);
}

}  // namespace
}  // namespace choreo::eval
