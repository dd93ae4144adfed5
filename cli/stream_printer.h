#pragma once
// Streams a workflow's decodes to the terminal as they are generated. A batch of parallel decodes is shown one
// message at a time: the first unfinished branch streams live, the others are buffered and shown (whole so
// far, then live) when the one before them finishes, so parallel branches never interleave on screen.
// Text that could still turn out to be the start of a stop string, or an incomplete UTF-8 character, is held
// back until it is decided; the engine's final text (cut at the stop string, EOG removed) is what ends up
// printed. On a terminal the text is escaped (common/terminal_text.h): escape sequences a model
// writes are shown, not obeyed. A pipe or file gets the exact text.

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "common/terminal_text.h"
#include "runtime/exec/interpreter.h"
#include "runtime/model/vocab.h"

namespace choreo::cli {

/// Prints decodes token by token; wire its methods to RunHooks.
class StreamPrinter {
 public:
  /// `colour(agent)` gives an ANSI SGR colour code ("36") or "" for plain output. The text is escaped when
  /// `out` is a terminal.
  StreamPrinter(const model::Vocab& vocab, std::function<std::string(const std::string&)> colour, FILE* out);

  void start(const std::vector<exec::DecodeBranch>& branches);
  void token(size_t branch, model::Token token);
  void finished(const exec::MessageRecord& record);

 private:
  struct Stream {
    std::string name, agent;
    std::vector<std::string> stop;
    std::string text;   // detokenised so far (EOG excluded)
    bool done = false;  // `text` is final
    size_t printed = 0;
    TerminalEscaper escaper;  // on a terminal
  };
  void header(const Stream& s);
  void write(Stream& s, std::string_view bytes);
  void flush(Stream& s);
  void advance();

  const model::Vocab& vocab_;
  std::function<std::string(const std::string&)> colour_;
  FILE* out_;
  bool escape_;
  std::vector<Stream> streams_;
  size_t live_ = 0;
};

}  // namespace choreo::cli
