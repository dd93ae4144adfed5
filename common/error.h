#pragma once
// Typed errors. A user can cause an InputError (bad file, bad flag, bad YAML/PML/GGUF, context overflow):
// the CLI prints it once and exits 2. A RuntimeFailure is the environment failing us (I/O, memory): exit 1.
// Programming errors are asserts, never these.

#include <fmt/format.h>

#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>

namespace choreo {

/// Where in a user's file an error is: file:line:col (1-based; 0 = unknown). Columns count UTF-8 characters
/// (a byte that is not valid UTF-8 counts as one), so a caret under the quoted line lines up with the text.
struct SourceLocation {
  std::string file;
  int line = 0;
  int col = 0;
  std::string to_string() const;
};

/// The 1-based column (in characters, as SourceLocation counts them) of byte `byte` of `line`.
int column_at_byte(std::string_view line, size_t byte);

/// `text` cut to at most `max_bytes` bytes at a character boundary, with "…" appended when cut.
std::string clip_text(std::string_view text, size_t max_bytes);

/// A line as an error quotes it: whole when it is short, else the window of kQuoteContextBytes either side of
/// the column (shifted to stay kQuoteContextBytes * 2 wide near either end, cut at character boundaries),
/// with "…" where text was cut. A multi-megabyte line gives a few hundred bytes, caret still in place.
struct QuotedLine {
  static constexpr size_t kQuoteContextBytes = 120;
  std::string text;
  int caret_col = 0;  ///< the column of the location within `text` (1-based; 0 = no caret)
};
QuotedLine quote_line(std::string_view line, int col);

/// An error the user caused and can fix; carries an optional location, the offending text and a hint.
/// Nothing in it is long: the message and the hint are cut at kMaxMessageBytes (they can name a value from
/// the input, e.g. a key given twice), the quoted line to its excerpt.
class InputError : public std::runtime_error {
 public:
  static constexpr size_t kMaxMessageBytes = 4096;
  /// `quoted_line` is the whole line at `where`; only its excerpt around `where.col` is kept (quote_line).
  explicit InputError(std::string message, std::string hint = {}, SourceLocation where = {},
                      std::string_view quoted_line = {});
  const std::string& message() const { return message_; }
  const std::string& hint() const { return hint_; }
  const SourceLocation& where() const { return where_; }
  /// The excerpt of the quoted line that is printed (the whole line when it is short).
  const std::string& quoted_line() const { return quoted_.text; }
  /// The same error with another message (e.g. prefixed with context), keeping location, quote and hint.
  InputError with_message(std::string message) const;
  /// The full multi-line rendering printed at the CLI boundary.
  std::string render() const;

 private:
  std::string message_, hint_;
  SourceLocation where_;
  QuotedLine quoted_;
};

/// A failure of the environment (I/O, allocation, a missing tool): exit code 1.
class RuntimeFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Memory ran out (std::bad_alloc, caught where it can be said what to change): exit code 1.
class OutOfMemory : public RuntimeFailure {
 public:
  using RuntimeFailure::RuntimeFailure;
};

/// Whether `error` holds an InputError (the user's to fix) rather than a failure of the environment.
bool is_input_error(const std::exception_ptr& error);

/// An exception caught on another thread, as text: an InputError rendered in full (ending in a newline),
/// any other exception's what() followed by a newline.
std::string describe_error(const std::exception_ptr& error);

}  // namespace choreo
