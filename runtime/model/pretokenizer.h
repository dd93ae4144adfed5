#pragma once
// The word splitter that runs before byte-level BPE merges: the regex list llama.cpp associates with a
// tokenizer.ggml.pre name, applied with PCRE2 (UTF mode, Unicode properties).

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace choreo::model {

/// How a BPE vocabulary pre-tokenizes, plus the flags llama.cpp ties to the same pre-tokenizer name.
struct BpeFlavor {
  std::vector<std::string> regexes;  // applied in order; each splits every piece the previous ones left
  bool ignore_merges = false;        // a word that is already a token is emitted whole (Llama 3)
  bool add_bos = false;              // the default for tokenizer.ggml.add_bos_token
  bool has_bos = true;               // false: the vocab has no BOS unless the metadata names one
};

/// The flavor for a tokenizer.ggml.pre value ("" means "default"); nullptr when the name is unknown.
const BpeFlavor* find_bpe_flavor(std::string_view pre_name);
/// Every name find_bpe_flavor accepts, comma-separated (for error hints).
std::string known_bpe_flavor_names();

/// A compiled regex list. Thread-safe: split() may run concurrently.
class PreTokenizer {
 public:
  /// Compiles `regexes`; throws std::invalid_argument if PCRE2 rejects one (a programming error here,
  /// since all lists are built in).
  explicit PreTokenizer(const std::vector<std::string>& regexes);
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;
  ~PreTokenizer();

  /// Splits `text` into consecutive, non-empty pieces that together are exactly `text`. Bytes that are not
  /// UTF-8 are matched as U+FFFD (as llama.cpp reads them) but stay themselves in the output.
  std::vector<std::string_view> split(std::string_view text) const;

 private:
  struct Pattern;
  std::vector<std::unique_ptr<Pattern>> patterns_;
};

}  // namespace choreo::model
