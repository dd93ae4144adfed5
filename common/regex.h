#pragma once
// The one wrapper of PCRE2 (the only file that includes pcre2.h is common/regex.cc): a compiled pattern in
// UTF-8 mode with Unicode properties (PCRE2_UTF | PCRE2_UCP, Python 3's \d, \w and \b), used by the
// expression functions regex_match/regex_capture (dsl/expr), the reference metrics (runtime/eval) and the
// pre-tokenizer (runtime/model). Matching is thread-safe: match data belongs to the caller.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace choreo {

class Regex {
 public:
  struct Options {
    /// Subjects may hold bytes that are not UTF-8; such bytes never match (PCRE2_MATCH_INVALID_UTF).
    /// Off: every subject must be valid UTF-8 (the caller checks it, see search's `utf_checked`).
    bool invalid_utf_never_matches = true;
    bool dollar_end_only = false;  // `$` matches only at the very end (PCRE2_DOLLAR_ENDONLY)
    bool jit = false;              // JIT-compile when PCRE2 has a JIT (falls back to the interpreter)
    /// PCRE2's match and depth limits, with 64 MiB of backtracking memory; 0 keeps PCRE2's defaults.
    uint32_t match_limit = 0;
  };

  /// Compiles `pattern`. A pattern that does not compile gives !ok() with the error and its byte offset.
  explicit Regex(std::string_view pattern);
  Regex(std::string_view pattern, Options options);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  bool ok() const { return code_ != nullptr; }
  const std::string& compile_error() const { return compile_error_; }
  size_t compile_error_offset() const { return compile_error_offset_; }
  uint32_t group_count() const { return group_count_; }
  /// The number of a named group, or -1.
  int group_number(const std::string& name) const;

  /// Outcome of a search: a match, none, or a match that failed: the match, depth or heap limit (the only
  /// way a valid pattern fails on a valid subject), or another PCRE2 error (Match::error()).
  enum class Outcome { Match, NoMatch, LimitExceeded };

  /// The match data of one search: the byte ranges of the groups that took part.
  class Match {
   public:
    explicit Match(const Regex& regex);
    ~Match();
    Match(const Match&) = delete;
    Match& operator=(const Match&) = delete;
    /// [begin, end) of group `group` (0 = the whole match) in the subject, or nullopt when it did not
    /// take part (or there is no such group).
    std::optional<std::pair<size_t, size_t>> group(int group) const;
    int error() const { return rc_; }  // PCRE2's return code of the last search

   private:
    friend class Regex;
    void* data_ = nullptr;  // pcre2_match_data_8
    int rc_ = 0;
  };

  /// Searches `subject` from byte `start` on (look-behinds see the bytes before it). `utf_checked`: the
  /// caller guarantees valid UTF-8 (PCRE2_NO_UTF_CHECK). Requires ok().
  Outcome search(std::string_view subject, size_t start, Match& match, bool utf_checked = false) const;
  /// Searches `subject` anywhere; on a match stores group `group` (nullopt when the group did not take part).
  Outcome search(std::string_view subject, int group, std::optional<std::string>* captured) const;

  /// Python's re.findall: every non-overlapping match, or group 1 of each when the pattern has a group.
  std::vector<std::string> find_all(std::string_view text) const;
  /// Python's re.sub(pattern, replacement, text) with a literal replacement.
  std::string replace_all(std::string_view text, std::string_view replacement) const;

 private:
  /// Calls on_match(whole, group 1 or whole) for each non-overlapping match, left to right.
  template <typename OnMatch>
  void for_each_match(std::string_view text, OnMatch on_match) const;

  void* code_ = nullptr;     // pcre2_code_8
  void* context_ = nullptr;  // pcre2_match_context_8, when there is a match limit
  uint32_t group_count_ = 0;
  std::string compile_error_;
  size_t compile_error_offset_ = 0;
};

}  // namespace choreo
