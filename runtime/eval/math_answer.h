#pragma once
// The MATH benchmark's answer rules (Hendrycks et al. 2021): the last \boxed{...} of a solution is its
// answer, and two answers are equal when their normalised strings are (math_equivalence.py's
// `_strip_string` / `is_equiv`). String rules only, in the original's order — `0.25` and `\frac{1}{4}`
// differ, `2` and `2.0` differ; `0.5` and `\frac{1}{2}` are special-cased equal. See docs/eval.md.

#include <optional>
#include <string>
#include <string_view>

namespace choreo::eval {

/// The last `\boxed{...}` or `\fbox{...}` of `text` with its braces matched, or the `\boxed ANSWER` form
/// (up to the next `$`) when the text holds "\boxed " anywhere; nullopt when there is none or the braces
/// never close (the official `last_boxed_only_string`).
std::optional<std::string> last_boxed_only_string(std::string_view text);

/// The inside of what last_boxed_only_string returned: `\boxed 5` -> `5`, `\boxed{x}` -> `x`,
/// `\fbox{x}` -> `x`; nullopt when `boxed` has none of these shapes.
std::optional<std::string> remove_boxed(std::string_view boxed);

/// remove_boxed(last_boxed_only_string(text)): the answer a solution or a model's output gives.
std::optional<std::string> extract_boxed_answer(std::string_view text);

/// The official normalisation (`_strip_string`). Throws std::out_of_range or std::logic_error exactly
/// where the Python original raises (e.g. `\sqrt` or `\frac` at the end, two "\text{ " units).
std::string strip_string(std::string_view answer);

/// The official `is_equiv`: equal normalised strings; when normalising either side raises, the raw
/// strings are compared instead. Two absent answers are equal, one absent answer is not.
bool is_equiv(const std::optional<std::string>& a, const std::optional<std::string>& b);

}  // namespace choreo::eval
