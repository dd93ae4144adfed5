#pragma once
// Fitting a line of text into an SVG figure without the font: the figure is drawn by whoever opens it, so the
// width of a text is estimated from its characters with widths no narrower than DejaVu Sans Bold's (a wide
// sans-serif, and what librsvg picks for "sans-serif" on Debian), and a text too wide for the figure is
// wrapped at spaces onto more lines. `profile reuse` titles its figures with the file names of its models,
// which are often wider than the figure (issue 42, finding 12).

#include <string>
#include <string_view>
#include <vector>

namespace choreo::eval {

/// `text` safe inside an XML element or a quoted attribute. Control characters XML 1.0 forbids become spaces.
std::string xml_escape(std::string_view text);

/// An upper estimate of the width in pixels of `text` (UTF-8) set in a sans-serif font of `font_px`.
double estimated_text_width_px(std::string_view text, double font_px);

/// `text` cut into lines whose estimated_text_width_px is at most `max_width_px`: at spaces where it can,
/// inside a word wider than a line (between two characters) where it must. The lines hold the text's words in
/// order, one space between two words of a line. At least one line, empty for an empty text.
std::vector<std::string> wrap_to_width(std::string_view text, double font_px, double max_width_px);

}  // namespace choreo::eval
