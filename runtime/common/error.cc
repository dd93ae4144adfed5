#include "runtime/common/error.h"

namespace choreo {

std::string SourceLocation::to_string() const {
  if (file.empty()) return {};
  if (line <= 0) return file;
  if (col <= 0) return fmt::format("{}:{}", file, line);
  return fmt::format("{}:{}:{}", file, line, col);
}

static std::string first_line(const std::string& where, const std::string& message) {
  return where.empty() ? message : where + ": " + message;
}

InputError::InputError(std::string message, std::string hint, SourceLocation where, std::string quoted_line)
    : std::runtime_error(first_line(where.to_string(), message)),
      message_(std::move(message)),
      hint_(std::move(hint)),
      where_(std::move(where)),
      quoted_line_(std::move(quoted_line)) {}

std::string InputError::render() const {
  std::string out = fmt::format("error: {}\n", what());
  if (!quoted_line_.empty()) {
    out += fmt::format("  | {}\n", quoted_line_);
    if (where_.col > 0) out += fmt::format("  | {}^\n", std::string(where_.col - 1, ' '));
  }
  if (!hint_.empty()) out += fmt::format("hint: {}\n", hint_);
  return out;
}

std::string describe_error(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const InputError& e) {
    return e.render();
  } catch (const std::exception& e) {
    return std::string(e.what()) + "\n";
  } catch (...) {
    return "unknown error\n";
  }
}

}  // namespace choreo
