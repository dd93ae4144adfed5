#define PCRE2_CODE_UNIT_WIDTH 8
#include "runtime/eval/regex.h"

#include <pcre2.h>

#include <cassert>

#include "runtime/eval/python_text.h"

namespace choreo::eval {

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

Regex::Regex(std::string_view pattern) : code_(std::make_unique<Code>()) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  // MATCH_INVALID_UTF: bytes that are not UTF-8 never match instead of failing the whole match.
  code_->code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error_code, &error_offset, nullptr);
  assert(code_->code != nullptr && "a metric's regular expression does not compile");
  uint32_t n_groups = 0;
  pcre2_pattern_info(code_->code, PCRE2_INFO_CAPTURECOUNT, &n_groups);
  has_group_ = n_groups > 0;
}

Regex::~Regex() = default;

namespace {

/// Calls `on_match(begin, end, group_begin, group_end)` for each non-overlapping match, left to right.
template <typename OnMatch>
void for_each_match(pcre2_code* code, std::string_view text, OnMatch on_match) {
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(code, nullptr);
  size_t offset = 0;
  while (offset <= text.size()) {
    const int rc =
        pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), offset, 0, data, nullptr);
    if (rc < 0) break;
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
    const size_t begin = ovector[0], end = ovector[1];
    const bool grouped = rc > 1 && ovector[2] != PCRE2_UNSET;
    on_match(begin, end, grouped ? ovector[2] : begin, grouped ? ovector[3] : end);
    offset = end > begin ? end : end + (end < text.size() ? code_point_bytes(text, end) : 1);
  }
  pcre2_match_data_free(data);
}

}  // namespace

std::vector<std::string> Regex::find_all(std::string_view text) const {
  std::vector<std::string> out;
  for_each_match(code_->code, text, [&](size_t begin, size_t end, size_t group_begin, size_t group_end) {
    if (has_group_)
      out.emplace_back(text.substr(group_begin, group_end - group_begin));
    else
      out.emplace_back(text.substr(begin, end - begin));
  });
  return out;
}

std::string Regex::replace_all(std::string_view text, std::string_view replacement) const {
  std::string out;
  size_t copied = 0;
  for_each_match(code_->code, text, [&](size_t begin, size_t end, size_t, size_t) {
    out.append(text.substr(copied, begin - copied));
    out.append(replacement);
    copied = end;
  });
  out.append(text.substr(copied));
  return out;
}

}  // namespace choreo::eval
