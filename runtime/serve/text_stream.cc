#include "runtime/serve/text_stream.h"

#include <algorithm>

#include "runtime/engine/stop_strings.h"

namespace choreo::serve {

namespace {

/// Bytes at the end of `text` that start a UTF-8 character whose continuation bytes have not all come.
size_t incomplete_utf8_tail(std::string_view text) {
  for (size_t back = 1; back <= std::min<size_t>(3, text.size()); ++back) {
    const unsigned char c = static_cast<unsigned char>(text[text.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

}  // namespace

TextStream::TextStream(std::vector<std::string> stops) {
  for (std::string& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string TextStream::append(std::string_view piece) {
  if (stopped_) return {};
  // A stop string not in the earlier text ends in the new bytes: look from (longest stop - 1) before them.
  size_t longest = 0;
  for (const std::string& stop : stops_) longest = std::max(longest, stop.size());
  const size_t keep = longest > 0 ? longest - 1 : 0;
  const size_t from = text_.size() > keep ? text_.size() - keep : 0;
  text_ += piece;
  size_t safe = text_.size();
  if (const size_t cut = runtime::find_stop(std::string_view(text_).substr(from), stops_); cut != std::string::npos) {
    stopped_ = true;
    safe = cut_ = from + cut;
    for (const std::string& stop : stops_)
      if (text_.compare(cut_, stop.size(), stop) == 0 && stop.size() > matched_.size()) matched_ = stop;
  } else {
    // Hold back the longest tail that is a proper prefix of some stop string.
    for (const std::string& stop : stops_)
      for (size_t n = std::min(stop.size() - 1, text_.size()); n > 0; --n)
        if (text_.compare(text_.size() - n, n, stop, 0, n) == 0) {
          safe = std::min(safe, text_.size() - n);
          break;
        }
    safe -= incomplete_utf8_tail(std::string_view(text_).substr(0, safe));
  }
  if (safe <= shown_) return {};
  std::string out = text_.substr(shown_, safe - shown_);
  shown_ = safe;
  return out;
}

std::string TextStream::finish(const std::string& final_text) {
  if (final_text.size() <= shown_) return {};
  std::string out = final_text.substr(shown_);
  shown_ = final_text.size();
  return out;
}

}  // namespace choreo::serve
