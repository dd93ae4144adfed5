#pragma once
// Model text shown on a terminal. A model can write escape sequences (ESC ] 52 sets the clipboard, ESC [ 2J
// clears the screen, CSI as the one character U+009B) that a terminal would obey. What goes to a terminal is
// therefore escaped: every C0 control but newline and tab, DEL, the C1 controls U+0080..U+009F and every
// byte that is not part of valid UTF-8 are shown as text: a byte as \xNN (ESC is \x1b, CR \x0d), a C1
// control as \u00NN (CSI is \u009b). So are the bidirectional controls (U+202A..U+202E, U+2066..U+2069,
// U+200E, U+200F, U+061C: \u202e), which would make a line read differently from its bytes. Everything else (printable ASCII, newline, tab, any other character)
// is passed as it is. Pipes and files get the model's exact bytes: callers escape only when isatty().

#include <string>
#include <string_view>

namespace choreo {

/// Escapes text that arrives in pieces (tokens): a UTF-8 sequence split across two pieces is held back until
/// it is complete, so it is judged (and passed, or escaped) whole.
class TerminalEscaper {
 public:
  /// The escaped form of the text so far that is complete; an unfinished UTF-8 sequence at the end waits.
  std::string feed(std::string_view piece);
  /// What is still held back, escaped: at the end of the text, an unfinished sequence is not UTF-8.
  std::string finish();

 private:
  std::string held_;
};

/// The whole of `text` escaped at once (feed and finish).
std::string escape_for_terminal(std::string_view text);

}  // namespace choreo
