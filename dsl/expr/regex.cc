#define PCRE2_CODE_UNIT_WIDTH 8
#include "dsl/expr/regex.h"

#include <array>

#include <pcre2.h>

namespace choreo::dsl::expr {

namespace {
pcre2_code* as_code(void* p) { return static_cast<pcre2_code*>(p); }
pcre2_match_context* as_context(void* p) { return static_cast<pcre2_match_context*>(p); }
}  // namespace

Regex::Regex(const std::string& pattern, uint32_t match_limit) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  // MATCH_INVALID_UTF: model output may be cut mid-character; such bytes simply never match.
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error_code, &error_offset,
                                   nullptr);
  if (!code) {
    std::array<PCRE2_UCHAR, 256> message{};
    pcre2_get_error_message(error_code, message.data(), message.size());
    compile_error_ = reinterpret_cast<const char*>(message.data());
    compile_error_offset_ = error_offset;
    return;
  }
  code_ = code;
  pcre2_pattern_info(code, PCRE2_INFO_CAPTURECOUNT, &group_count_);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_set_match_limit(context, match_limit);
  pcre2_set_depth_limit(context, match_limit);
  pcre2_set_heap_limit(context, 64 * 1024);  // KiB of backtracking memory
  context_ = context;
}

Regex::~Regex() {
  pcre2_match_context_free(as_context(context_));
  pcre2_code_free(as_code(code_));
}

int Regex::group_number(const std::string& name) const {
  int n = pcre2_substring_number_from_name(as_code(code_), reinterpret_cast<PCRE2_SPTR>(name.c_str()));
  return n > 0 ? n : -1;
}

Regex::Outcome Regex::search(std::string_view subject, int group, std::optional<std::string>* captured) const {
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(as_code(code_), nullptr);
  const int rc = pcre2_match(as_code(code_), reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), 0, 0,
                             data, as_context(context_));
  Outcome outcome = Outcome::NoMatch;
  if (rc >= 0) {
    outcome = Outcome::Match;
    if (captured) {
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
      const uint32_t pairs = pcre2_get_ovector_count(data);
      captured->reset();
      if (group >= 0 && static_cast<uint32_t>(group) < pairs && ovector[2 * group] != PCRE2_UNSET)
        *captured = std::string(subject.substr(ovector[2 * group], ovector[2 * group + 1] - ovector[2 * group]));
    }
  } else if (rc != PCRE2_ERROR_NOMATCH) {
    outcome = Outcome::LimitExceeded;  // match, depth or heap limit (the only failures a valid pattern has)
  }
  pcre2_match_data_free(data);
  return outcome;
}

}  // namespace choreo::dsl::expr
