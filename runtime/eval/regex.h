#pragma once
// A compiled PCRE2 pattern with Python 3's Unicode semantics for \d, \w and \b (PCRE2_UTF | PCRE2_UCP),
// for the few regular expressions the reference metrics use.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace choreo::eval {

/// One pattern, compiled once; matching is thread-safe (match data is per call).
class Regex {
 public:
  /// `pattern` is a programming constant: a pattern that does not compile is an assert-level error.
  explicit Regex(std::string_view pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  /// Python's re.findall: every non-overlapping match, or group 1 of each when the pattern has a group.
  std::vector<std::string> find_all(std::string_view text) const;
  /// Python's re.sub(pattern, replacement, text) with a literal replacement.
  std::string replace_all(std::string_view text, std::string_view replacement) const;

 private:
  struct Code;
  std::unique_ptr<Code> code_;
  bool has_group_ = false;
};

}  // namespace choreo::eval
