#include "dsl/expr/context.h"

#include <fmt/format.h>

#include "common/regex.h"

namespace choreo::dsl::expr {

Context::Context(const SourceText& source, const EvalLimits& limits) : source_(source), limits_(limits) {}
Context::~Context() = default;

void Context::step(size_t offset, int64_t steps) {
  steps_ += steps;
  if (steps_ > limits_.max_steps)
    throw error(offset, fmt::format("evaluation took more than {} steps", limits_.max_steps),
                "a loop, comprehension or text operation is too large; make the data smaller");
}

void Context::reserve_string(size_t offset, size_t bytes) {
  if (bytes > limits_.max_string_bytes)
    throw error(offset, fmt::format("string of {} bytes is too long", bytes),
                fmt::format("strings are limited to {} bytes", limits_.max_string_bytes));
  total_bytes_ += bytes;
  if (total_bytes_ > limits_.max_total_bytes)
    throw error(offset, fmt::format("evaluation built more than {} bytes of data", limits_.max_total_bytes),
                "make the data smaller");
  scan(offset, bytes);
}

void Context::reserve_list(size_t offset, size_t length) {
  if (length > limits_.max_list_length)
    throw error(offset, fmt::format("list of {} elements is too long", length),
                fmt::format("lists are limited to {} elements", limits_.max_list_length));
  total_bytes_ += length * sizeof(Value);
  if (total_bytes_ > limits_.max_total_bytes)
    throw error(offset, fmt::format("evaluation built more than {} bytes of data", limits_.max_total_bytes),
                "make the data smaller");
  step(offset, static_cast<int64_t>(length / 16));
}

void Context::check_list_length(size_t offset, size_t length) {
  if (length > limits_.max_list_length)
    throw error(offset, fmt::format("list of more than {} elements is too long", limits_.max_list_length),
                "make the loop or comprehension smaller");
}

Value Context::make_string(size_t offset, std::string text) {
  reserve_string(offset, text.size());
  return Value::string(std::move(text));
}

Value Context::make_list(size_t offset, List items) {
  reserve_list(offset, items.size());
  return Value::list(std::move(items));
}

const Regex& Context::regex(size_t offset, const std::string& pattern) {
  auto it = regexes_.find(pattern);
  if (it == regexes_.end()) {
    auto compiled = std::make_unique<Regex>(pattern, Regex::Options{.match_limit = limits_.regex_match_limit});
    if (!compiled->ok())
      throw error(offset, fmt::format("bad regex: {} (at pattern offset {})", compiled->compile_error(),
                                      compiled->compile_error_offset()),
                  "patterns are PCRE2; write them as raw strings r'...' so backslashes stay");
    it = regexes_.emplace(pattern, std::move(compiled)).first;
  }
  return *it->second;
}

}  // namespace choreo::dsl::expr
