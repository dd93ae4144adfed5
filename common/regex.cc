#define PCRE2_CODE_UNIT_WIDTH 8
#include "common/regex.h"

#include <pcre2.h>

#include <array>
#include <cassert>

namespace choreo {

namespace {

pcre2_code* as_code(void* p) { return static_cast<pcre2_code*>(p); }
pcre2_match_context* as_context(void* p) { return static_cast<pcre2_match_context*>(p); }
pcre2_match_data* as_data(void* p) { return static_cast<pcre2_match_data*>(p); }

/// Bytes of the UTF-8 character at `offset`: its sequence length when the lead and continuation bytes are
/// there, else 1 (a stray byte is a character of its own).
size_t character_bytes(std::string_view text, size_t offset) {
  const auto lead = static_cast<unsigned char>(text[offset]);
  const size_t n = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 1;
  if (offset + n > text.size()) return 1;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(text[offset + k]) & 0xC0) != 0x80) return 1;
  return n;
}

}  // namespace

Regex::Regex(std::string_view pattern) : Regex(pattern, Options{}) {}

Regex::Regex(std::string_view pattern, Options options) {
  uint32_t flags = PCRE2_UTF | PCRE2_UCP;
  if (options.invalid_utf_never_matches) flags |= PCRE2_MATCH_INVALID_UTF;
  if (options.dollar_end_only) flags |= PCRE2_DOLLAR_ENDONLY;
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), flags,
                                   &error_code, &error_offset, nullptr);
  if (!code) {
    std::array<PCRE2_UCHAR, 256> message{};
    pcre2_get_error_message(error_code, message.data(), message.size());
    compile_error_ = reinterpret_cast<const char*>(message.data());
    compile_error_offset_ = error_offset;
    return;
  }
  code_ = code;
  pcre2_pattern_info(code, PCRE2_INFO_CAPTURECOUNT, &group_count_);
  if (options.jit) pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // an error here leaves the interpreter
  if (options.match_limit > 0) {
    pcre2_match_context* context = pcre2_match_context_create(nullptr);
    pcre2_set_match_limit(context, options.match_limit);
    pcre2_set_depth_limit(context, options.match_limit);
    pcre2_set_heap_limit(context, 64 * 1024);  // KiB of backtracking memory
    context_ = context;
  }
}

Regex::~Regex() {
  pcre2_match_context_free(as_context(context_));
  pcre2_code_free(as_code(code_));
}

int Regex::group_number(const std::string& name) const {
  const int n = pcre2_substring_number_from_name(as_code(code_), reinterpret_cast<PCRE2_SPTR>(name.c_str()));
  return n > 0 ? n : -1;
}

Regex::Match::Match(const Regex& regex)
    : data_(pcre2_match_data_create_from_pattern(as_code(regex.code_), nullptr)) {}

Regex::Match::~Match() { pcre2_match_data_free(as_data(data_)); }

std::optional<std::pair<size_t, size_t>> Regex::Match::group(int group) const {
  if (rc_ < 0 || group < 0 || static_cast<uint32_t>(group) >= pcre2_get_ovector_count(as_data(data_)))
    return std::nullopt;
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(as_data(data_));
  if (ovector[2 * group] == PCRE2_UNSET) return std::nullopt;
  return std::pair<size_t, size_t>(ovector[2 * group], ovector[2 * group + 1]);
}

Regex::Outcome Regex::search(std::string_view subject, size_t start, Match& match, bool utf_checked) const {
  assert(ok());
  match.rc_ = pcre2_match(as_code(code_), reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), start,
                          utf_checked ? PCRE2_NO_UTF_CHECK : 0, as_data(match.data_), as_context(context_));
  if (match.rc_ >= 0) return Outcome::Match;
  return match.rc_ == PCRE2_ERROR_NOMATCH ? Outcome::NoMatch : Outcome::LimitExceeded;
}

Regex::Outcome Regex::search(std::string_view subject, int group, std::optional<std::string>* captured) const {
  Match match(*this);
  const Outcome outcome = search(subject, 0, match);
  if (outcome == Outcome::Match && captured) {
    captured->reset();
    if (auto range = match.group(group)) *captured = std::string(subject.substr(range->first, range->second - range->first));
  }
  return outcome;
}

template <typename OnMatch>
void Regex::for_each_match(std::string_view text, OnMatch on_match) const {
  assert(ok() && "a constant regular expression does not compile");
  Match match(*this);
  size_t offset = 0;
  while (offset <= text.size() && search(text, offset, match) == Outcome::Match) {
    const auto whole = *match.group(0);
    on_match(whole, match.group(1).value_or(whole));
    const auto [begin, end] = whole;
    offset = end > begin ? end : end + (end < text.size() ? character_bytes(text, end) : 1);
  }
}

std::vector<std::string> Regex::find_all(std::string_view text) const {
  std::vector<std::string> out;
  for_each_match(text, [&](std::pair<size_t, size_t> whole, std::pair<size_t, size_t> first_group) {
    const auto [begin, end] = group_count_ > 0 ? first_group : whole;
    out.emplace_back(text.substr(begin, end - begin));
  });
  return out;
}

std::string Regex::replace_all(std::string_view text, std::string_view replacement) const {
  std::string out;
  size_t copied = 0;
  for_each_match(text, [&](std::pair<size_t, size_t> whole, std::pair<size_t, size_t>) {
    out.append(text.substr(copied, whole.first - copied));
    out.append(replacement);
    copied = whole.second;
  });
  out.append(text.substr(copied));
  return out;
}

}  // namespace choreo
