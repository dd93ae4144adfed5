#pragma once
// Typed errors. A user can cause an InputError (bad file, bad flag, bad YAML/PML/GGUF, context overflow):
// the CLI prints it once and exits 2. A RuntimeFailure is the environment failing us (I/O, memory): exit 1.
// Programming errors are asserts, never these.

#include <exception>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace choreo {

/// Where in a user's file an error is: file:line:col (1-based; 0 = unknown).
struct SourceLocation {
  std::string file;
  int line = 0;
  int col = 0;
  std::string to_string() const;
};

/// An error the user caused and can fix; carries an optional location, the offending text and a hint.
class InputError : public std::runtime_error {
 public:
  explicit InputError(std::string message, std::string hint = {}, SourceLocation where = {},
                      std::string quoted_line = {});
  const std::string& message() const { return message_; }
  const std::string& hint() const { return hint_; }
  const SourceLocation& where() const { return where_; }
  const std::string& quoted_line() const { return quoted_line_; }
  /// The full multi-line rendering printed at the CLI boundary.
  std::string render() const;

 private:
  std::string message_, hint_;
  SourceLocation where_;
  std::string quoted_line_;
};

/// A failure of the environment (I/O, allocation, a missing tool): exit code 1.
class RuntimeFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// An exception caught on another thread, as text: an InputError rendered in full (ending in a newline),
/// any other exception's what() followed by a newline.
std::string describe_error(const std::exception_ptr& error);

}  // namespace choreo
