#pragma once
// Typed access to a library call's arguments, with errors that point at the offending argument.
// Internal to dsl/expr (shared by functions.cc and text_functions.cc).

#include <span>
#include <string>

#include <fmt/format.h>

#include "dsl/expr/context.h"
#include "dsl/expr/functions.h"

namespace choreo::dsl::expr {

/// The evaluated arguments of one call, their positions, and the call's context.
struct Arguments {
  const FunctionInfo& function;
  std::span<const Value> values;
  Context& context;
  size_t call_offset;
  std::span<const size_t> offsets;

  size_t size() const { return values.size(); }
  const Value& operator[](size_t i) const { return values[i]; }
  size_t offset(size_t i) const { return i < offsets.size() ? offsets[i] : call_offset; }

  InputError error(size_t i, std::string message, std::string hint = {}) const {
    return context.error(offset(i), std::move(message), hint.empty() ? std::string(function.signature) : hint);
  }
  [[noreturn]] void wrong_type(size_t i, std::string_view expected) const {
    throw error(i, fmt::format("{}() argument {} must be {}, got {}", function.name, i + 1, expected,
                               values[i].type_name()));
  }
  const std::string& text(size_t i) const {
    if (!values[i].is_text()) wrong_type(i, "a string");
    return values[i].as_text();
  }
  const List& list(size_t i) const {
    if (values[i].type() != Type::List) wrong_type(i, "a list");
    return values[i].as_list();
  }
  int64_t integer(size_t i) const {
    if (values[i].type() != Type::Int) wrong_type(i, "an int");
    return values[i].as_int();
  }
};

/// The text functions (text_functions.cc): strip, lower, upper, split, join, str, int, float, regex_match,
/// regex_capture, json, boxed. Returns false when `name` is none of them.
bool call_text_function(std::string_view name, const Arguments& args, Value* result);

}  // namespace choreo::dsl::expr
