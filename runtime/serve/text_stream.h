#pragma once
// The text of a decode as a client may see it while it is generated: each token's bytes are held back while
// they could be the start of a stop string (the final text ends before the first one) or end inside a UTF-8
// character, and given out once they cannot. What is given out is always a prefix of the final text.

#include <string>
#include <string_view>
#include <vector>

namespace choreo::serve {

class TextStream {
 public:
  explicit TextStream(std::vector<std::string> stops);
  /// Appends one token's bytes; returns the text that may be shown now (possibly empty).
  std::string append(std::string_view piece);
  /// The decode ended with `final_text` (the engine's, cut at a stop string): what was not shown yet.
  std::string finish(const std::string& final_text);
  /// A stop string was appended: the text ends before it, and nothing more will be shown.
  bool stopped() const { return stopped_; }
  /// The stop string the text ended at ("" when none).
  const std::string& stop_string() const { return matched_; }
  /// Everything appended, cut before the first stop string.
  std::string text() const { return stopped_ ? text_.substr(0, cut_) : text_; }

 private:
  std::vector<std::string> stops_;
  std::string text_;   // everything appended
  size_t shown_ = 0;   // bytes of text_ given out
  bool stopped_ = false;
  std::string matched_;
  size_t cut_ = 0;     // where the stop string starts, once stopped
};

}  // namespace choreo::serve
