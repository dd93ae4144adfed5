#pragma once
// Stop strings (DecodeRequest::stop): when a decode stops, and where its text ends.

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace choreo::runtime {

/// Where the first stop string in `text` begins: the earliest occurrence of any non-empty one, or npos.
/// Empty stop strings never match.
size_t find_stop(std::string_view text, std::span<const std::string> stops);

/// Tells, one token at a time, whether the text generated so far contains a stop string, looking only at the
/// new token's bytes and the last (longest stop - 1) bytes before them: an occurrence that was not in the
/// earlier text must end in the new bytes, so it starts at most that far back. After every append the answer
/// equals `find_stop(whole text) != npos`, but the work per token does not grow with the text (the whole-text
/// rule made a decode O(n²) in its length).
/// Bytes are compared as find_stop compares them, so a stop string whose UTF-8 bytes arrive in different
/// tokens (byte-fallback tokens, byte-level BPE pieces ending inside a character) is found when its last byte
/// arrives; an incomplete character needs no holding back, as it is just the end of the kept bytes.
class StopScanner {
 public:
  explicit StopScanner(std::span<const std::string> stops);
  /// Appends one token's bytes. True from the token that completes a stop string on.
  bool append(std::string_view piece);

 private:
  std::vector<std::string> stops_;  // the non-empty stop strings
  size_t keep_bytes_ = 0;           // longest stop string's length - 1
  std::string tail_;                // the last keep_bytes_ bytes of the text (fewer at its start)
  bool found_ = false;
};

}  // namespace choreo::runtime
