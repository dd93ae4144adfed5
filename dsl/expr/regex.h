#pragma once
// A PCRE2 pattern with a match limit, for regex_match and regex_capture. Internal to dsl/expr.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace choreo::dsl::expr {

/// One compiled pattern (UTF-8, Unicode properties; subjects may hold invalid UTF-8).
class Regex {
 public:
  /// Compiles `pattern`; on failure returns nullptr-like state and fills `error` and `error_offset`.
  Regex(const std::string& pattern, uint32_t match_limit);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  bool ok() const { return code_ != nullptr; }
  const std::string& compile_error() const { return compile_error_; }
  size_t compile_error_offset() const { return compile_error_offset_; }
  uint32_t group_count() const { return group_count_; }
  /// The number of a named group, or -1.
  int group_number(const std::string& name) const;

  /// Outcome of a search: matched, or not, or the match limit was hit.
  enum class Outcome { Match, NoMatch, LimitExceeded };
  /// Searches `subject` anywhere; on a match stores group `group` (nullopt when the group did not take part).
  Outcome search(std::string_view subject, int group, std::optional<std::string>* captured) const;

 private:
  void* code_ = nullptr;     // pcre2_code_8
  void* context_ = nullptr;  // pcre2_match_context_8
  uint32_t group_count_ = 0;
  std::string compile_error_;
  size_t compile_error_offset_ = 0;
};

}  // namespace choreo::dsl::expr
