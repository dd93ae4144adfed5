#pragma once
// One line of a JSONL input with located errors: parsing (noting keys given twice, which the JSON parser
// would silently collapse), finding a field's byte column so that errors point at it, and typed field access
// that names the field, the wanted type and the line.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "runtime/model/vocab.h"

namespace choreo::exec {

/// The parser's own message (which quotes what it last read) is cut to this many bytes.
inline constexpr size_t kMaxJsonErrorBytes = 160;

/// "an integer", "a string", "a list", ... for error messages.
std::string type_name(const nlohmann::json& value);

/// A byte range [begin, end) of a line.
struct ByteRange {
  size_t begin = 0, end = 0;
};
/// The byte ranges of a line's top-level list elements (the whole line when it is not a list). Meant for
/// lines that parsed as JSON: it only tracks strings and brackets.
std::vector<ByteRange> element_ranges(std::string_view line);

/// One input line as read, with its JSON value or the reason it is not JSON.
struct JsonLine {
  int number = 0;
  std::string text;
  nlohmann::json value;
  std::string json_error;      // empty when the line parsed
  size_t json_error_byte = 0;  // 1-based byte where parsing failed
  std::string duplicate_key;   // the first key given twice in one object, if any
  /// The column (in characters, as SourceLocation counts) of json_error_byte.
  int json_error_column() const { return column_at_byte(text, json_error_byte > 0 ? json_error_byte - 1 : 0); }
};
JsonLine parse_json_line(int number, std::string text);

/// Where one call sits in its line; builds located errors that point at a field when it can.
class CallSite {
 public:
  /// `batch_index` is the call's index in a batch line, -1 for a line holding one call.
  CallSite(const std::string& file, const JsonLine& line, ByteRange range, int batch_index)
      : file_(file), line_(line), range_(range), batch_index_(batch_index) {}

  /// file:line:col of a byte of the line (no column for npos).
  SourceLocation location(size_t byte) const;
  /// The call's own start: its opening brace in a batch, npos (no column) for a line holding one call.
  size_t start() const { return batch_index_ >= 0 ? range_.begin : std::string::npos; }
  /// Throws InputError at `byte` (the call's start for npos), quoting short lines.
  [[noreturn]] void fail(const std::string& message, const std::string& hint = {},
                         size_t byte = std::string::npos) const;

  /// Byte offset of `"key"` (followed by a colon) inside this call, or of the value after the colon; the
  /// call's start when absent.
  size_t key_byte(std::string_view key) const { return find_key(key, false); }
  size_t value_byte(std::string_view key) const { return find_key(key, true); }
  /// Byte offset of `needle` at or after `from` inside this call (npos when absent).
  size_t find(std::string_view needle, size_t from) const;

 private:
  size_t find_key(std::string_view key, bool value) const;

  const std::string& file_;
  const JsonLine& line_;
  ByteRange range_;
  int batch_index_;
};

/// Typed access to one call object's fields; a JSON null counts as absent. Every failure names the field and
/// points at its value.
class Fields {
 public:
  Fields(const nlohmann::json& object, const CallSite& site) : object_(object), site_(site) {}

  const nlohmann::json* get(std::string_view key) const;
  bool has(std::string_view key) const { return get(key) != nullptr; }

  [[noreturn]] void wrong_type(std::string_view key, const nlohmann::json& value,
                               std::string_view wanted) const;
  [[noreturn]] void bad_value(std::string_view key, const std::string& message,
                              const std::string& hint = {}) const;

  std::optional<std::string> string(std::string_view key) const;
  std::optional<bool> boolean(std::string_view key) const;
  /// An integer in [lo, hi].
  std::optional<int> integer(std::string_view key, int64_t lo, int64_t hi) const;
  /// A finite number in [lo, hi].
  std::optional<double> number(std::string_view key, double lo, double hi) const;
  /// A non-negative integer of up to 64 bits.
  std::optional<uint64_t> unsigned64(std::string_view key) const;
  /// A list of token ids, each in [0, n_vocab).
  std::optional<std::vector<model::Token>> tokens(std::string_view key, int n_vocab) const;
  /// A string or a list of strings.
  std::optional<std::vector<std::string>> strings(std::string_view key) const;

 private:
  const nlohmann::json& object_;
  const CallSite& site_;
};

}  // namespace choreo::exec
