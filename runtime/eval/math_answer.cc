#include "runtime/eval/math_answer.h"

#include <stdexcept>
#include <vector>

#include "runtime/eval/python_text.h"

namespace choreo::eval {

std::optional<std::string> last_boxed_only_string(std::string_view text) {
  // The `\boxed 5` form wins whenever it occurs, as in the reference: the piece after the last "\boxed ",
  // cut at the first "$".
  constexpr std::string_view kSpaced = "\\boxed ";
  if (text.find(kSpaced) != std::string_view::npos) {
    const size_t last = text.rfind(kSpaced) + kSpaced.size();
    const std::string_view rest = text.substr(last);
    return std::string(kSpaced) + std::string(rest.substr(0, rest.find('$')));
  }
  size_t start = text.rfind("\\boxed");
  if (start == std::string_view::npos) start = text.rfind("\\fbox");
  if (start == std::string_view::npos) return std::nullopt;
  int open = 0;
  for (size_t k = start; k < text.size(); ++k) {
    if (text[k] == '{') ++open;
    if (text[k] == '}' && --open == 0) return std::string(text.substr(start, k - start + 1));
  }
  return std::nullopt;
}

std::optional<std::string> remove_boxed(std::string_view boxed) {
  constexpr std::string_view kSpaced = "\\boxed ";
  if (boxed.find(kSpaced) != std::string_view::npos) {
    if (!boxed.starts_with(kSpaced)) return std::nullopt;
    return std::string(boxed.substr(kSpaced.size()));
  }
  for (std::string_view left : {std::string_view("\\boxed{"), std::string_view("\\fbox{")}) {
    if (boxed.size() > left.size() && boxed.starts_with(left) && boxed.ends_with('}'))
      return std::string(boxed.substr(left.size(), boxed.size() - left.size() - 1));
  }
  return std::nullopt;
}

std::optional<std::string> extract_boxed_answer(std::string_view text) {
  std::optional<std::string> boxed = last_boxed_only_string(text);
  if (!boxed) return std::nullopt;
  return remove_boxed(*boxed);
}

namespace {

/// `\frac12` -> `\frac{1}{2}`, `\frac1b` -> `\frac{1}{b}`, `\frac1{72}` -> `\frac{1}{72}` (`_fix_fracs`).
/// A `\frac` followed by a single character leaves the whole input unchanged; one at the very end raises.
std::string fix_fracs(const std::string& text) {
  const std::vector<std::string> pieces = split(text, "\\frac");
  std::string out = pieces[0];
  for (size_t i = 1; i < pieces.size(); ++i) {
    const std::string& piece = pieces[i];
    out += "\\frac";
    if (piece.empty()) throw std::out_of_range("\\frac at the end of the answer");
    if (piece[0] == '{') {
      out += piece;
      continue;
    }
    if (code_point_count(piece) < 2) return text;
    const std::string_view a = first_code_point(piece);
    const std::string_view after_a = std::string_view(piece).substr(a.size());
    const std::string_view b = first_code_point(after_a);
    const std::string_view post = after_a.substr(b.size());
    if (b != "{")
      out += "{" + std::string(a) + "}{" + std::string(b) + "}" + std::string(post);
    else
      out += "{" + std::string(a) + "}" + std::string(b) + std::string(post);
  }
  return out;
}

/// A decimal integer exactly as Python's str(int(s)) would print it: -?(0|[1-9][0-9]*).
bool is_canonical_integer(std::string_view s) {
  if (!s.empty() && s[0] == '-') s.remove_prefix(1);
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return s.size() == 1 || s[0] != '0';
}

/// `a/b` with integers a, b -> `\frac{a}{b}` (`_fix_a_slash_b`): int() must parse both sides and
/// "{a}/{b}" must give the text back, which holds exactly for canonical integers.
std::string fix_a_slash_b(const std::string& text) {
  const std::vector<std::string> pieces = split(text, "/");
  if (pieces.size() != 2) return text;
  if (!is_canonical_integer(pieces[0]) || !is_canonical_integer(pieces[1])) return text;
  return "\\frac{" + pieces[0] + "}{" + pieces[1] + "}";
}

/// Drops everything from "\text{ " on (`_remove_right_units`); raises when it occurs twice.
std::string remove_right_units(const std::string& text) {
  if (text.find("\\text{ ") == std::string::npos) return text;
  const std::vector<std::string> pieces = split(text, "\\text{ ");
  if (pieces.size() != 2) throw std::logic_error("\"\\text{ \" occurs more than once");
  return pieces[0];
}

/// `\sqrt2` -> `\sqrt{2}` (`_fix_sqrt`); a `\sqrt` with nothing after it raises.
std::string fix_sqrt(const std::string& text) {
  if (text.find("\\sqrt") == std::string::npos) return text;
  const std::vector<std::string> pieces = split(text, "\\sqrt");
  std::string out = pieces[0];
  for (size_t i = 1; i < pieces.size(); ++i) {
    const std::string& piece = pieces[i];
    if (piece.empty()) throw std::out_of_range("\\sqrt at the end of a piece");
    if (piece[0] != '{') {
      const std::string_view a = first_code_point(piece);
      out += "\\sqrt{" + std::string(a) + "}" + piece.substr(a.size());
    } else {
      out += "\\sqrt" + piece;
    }
  }
  return out;
}

}  // namespace

std::string strip_string(std::string_view answer) {
  std::string s(answer);
  s = replace_all(s, "\n", "");
  s = replace_all(s, "\\!", "");
  s = replace_all(s, "\\\\", "\\");
  s = replace_all(s, "tfrac", "frac");
  s = replace_all(s, "dfrac", "frac");
  s = replace_all(s, "\\left", "");
  s = replace_all(s, "\\right", "");
  s = replace_all(s, "^{\\circ}", "");
  s = replace_all(s, "^\\circ", "");
  s = replace_all(s, "\\$", "");
  s = remove_right_units(s);
  s = replace_all(s, "\\%", "");
  s = replace_all(s, "%", "");
  s = replace_all(s, " .", " 0.");
  s = replace_all(s, "{.", "{0.");
  if (s.empty()) return s;
  if (s[0] == '.') s = "0" + s;
  // A short left-hand side such as "k = " or "x=" is dropped (at most two characters, counted as Python
  // does).
  const std::vector<std::string> sides = split(s, "=");
  if (sides.size() == 2 && code_point_count(sides[0]) <= 2) s = sides[1];
  s = fix_sqrt(s);
  s = replace_all(s, " ", "");
  s = fix_fracs(s);
  if (s == "0.5") s = "\\frac{1}{2}";
  s = fix_a_slash_b(s);
  return s;
}

bool is_equiv(const std::optional<std::string>& a, const std::optional<std::string>& b) {
  if (!a && !b) return true;
  if (!a || !b) return false;
  try {
    return strip_string(*a) == strip_string(*b);
  } catch (const std::exception&) {
    return *a == *b;
  }
}

}  // namespace choreo::eval
