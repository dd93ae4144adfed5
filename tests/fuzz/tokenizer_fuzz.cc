// libFuzzer target for the tokenizers (runtime/model/vocab*): any bytes, tokenised by a SentencePiece vocab
// (llama-spm) and by byte-level BPE vocabs with different pre-tokenizers (gpt-2, deepseek-coder, mpt,
// refact), with and without special-token parsing, must give ids inside the vocab and never crash, hang or
// leak. Oracle (the round trip vocab.h promises): for valid UTF-8 text whose every byte the vocab has a token
// for, detokenize(tokenize(text)) == text, except that SentencePiece writes U+2581 back as a space.
// The vocab files come from $CHOREO_SHARED/models/vocab (else $CHOREO_SOURCE_DIR/../shared/models/vocab).
// With CHOREO_FUZZ_SEED_DIR set, start-up copies the shared *.inp test texts there as seeds (scripts/fuzz.sh).

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "runtime/model/gguf.h"
#include "runtime/model/unicode.h"
#include "runtime/model/vocab.h"
#include "tests/fuzz/fuzz_common.h"

namespace {

using choreo::model::Token;
using choreo::model::Vocab;

struct Loaded {
  std::string name;
  bool spm = false;
  Vocab vocab;
  std::array<bool, 256> has_byte{};  // the vocab has a token for this byte (<0xAB> in SPM, GPT-2's char in BPE)
};

/// Which bytes a vocabulary can spell on their own. A byte it cannot is dropped, as llama.cpp drops it
/// (the refact vocabulary has no token for 0xF1), so only text made of such bytes must round-trip.
std::array<bool, 256> bytes_with_tokens(const Vocab& vocab, bool spm) {
  std::array<bool, 256> has{};
  for (int b = 0; b < 256; ++b) {
    char spm_piece[8];
    std::snprintf(spm_piece, sizeof spm_piece, "<0x%02X>", b);
    has[size_t(b)] = vocab.find(spm ? std::string_view(spm_piece)
                                    : choreo::model::byte_to_unicode(static_cast<uint8_t>(b))) >= 0;
  }
  return has;
}

std::filesystem::path vocab_dir() { return choreo::fuzz::shared_dir() / "models" / "vocab"; }

const std::vector<Loaded>& vocabs() {
  static const std::vector<Loaded> loaded = [] {
    std::vector<Loaded> out;
    for (const char* name : {"llama-spm", "gpt-2", "deepseek-coder", "mpt", "refact"}) {
      const std::filesystem::path path = vocab_dir() / (std::string("ggml-vocab-") + name + ".gguf");
      try {
        const bool spm = std::string(name) == "llama-spm";
        Vocab vocab = Vocab::from_gguf(choreo::gguf::File::open(path));
        const std::array<bool, 256> has_byte = bytes_with_tokens(vocab, spm);
        out.push_back({name, spm, std::move(vocab), has_byte});
      } catch (const std::exception& e) {
        std::fprintf(stderr, "tokenizer_fuzz: cannot load %s: %s (set CHOREO_SHARED)\n", path.c_str(), e.what());
        std::abort();
      }
    }
    if (const char* seeds = std::getenv("CHOREO_FUZZ_SEED_DIR")) {
      // Each .inp file holds llama.cpp's test texts separated by a marker line; every text becomes a seed.
      const std::string marker = "\n__ggml_vocab_test__\n";
      int i = 0;
      for (const auto& entry : std::filesystem::directory_iterator(vocab_dir())) {
        if (entry.path().extension() != ".inp") continue;
        std::ifstream in(entry.path(), std::ios::binary);
        const std::string all((std::istreambuf_iterator<char>(in)), {});
        for (size_t start = 0; start < all.size();) {
          size_t end = all.find(marker, start);
          if (end == std::string::npos) end = all.size();
          std::ofstream(std::filesystem::path(seeds) / ("seed_" + std::to_string(i++)), std::ios::binary)
              << all.substr(start, end - start);
          start = end + marker.size();
        }
      }
    }
    return out;
  }();
  return loaded;
}

std::string spaces_for_u2581(std::string s) {
  const std::string mark = "\xe2\x96\x81";
  for (size_t at = s.find(mark); at != std::string::npos; at = s.find(mark, at + 1)) s.replace(at, mark.size(), " ");
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;  // tokenisers are linear-ish; long inputs only slow the search down
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const bool utf8 = choreo::model::is_strict_utf8(text);  // the oracle holds for well-formed text
  for (const Loaded& l : vocabs()) {
    const int n_vocab = l.vocab.n_tokens();
    for (bool parse_special : {false, true}) {
      std::vector<Token> ids;
      try {
        ids = l.vocab.tokenize(text, /*add_special=*/false, parse_special);
      } catch (const choreo::InputError&) {
        continue;  // a clear refusal is allowed; a crash or another exception is not
      }
      for (Token id : ids)
        if (id < 0 || id >= n_vocab) __builtin_trap();
      const std::string back = l.vocab.detokenize(ids, /*special=*/parse_special);
      const bool spellable = std::all_of(text.begin(), text.end(),
                                         [&](char c) { return l.has_byte[static_cast<uint8_t>(c)]; });
      if (!parse_special && utf8 && spellable) {
        const std::string expected = l.spm ? spaces_for_u2581(std::string(text)) : std::string(text);
        if (back != expected) {
          std::fprintf(stderr, "tokenizer_fuzz: %s does not round-trip (%zu ids)\n", l.name.c_str(), ids.size());
          __builtin_trap();
        }
      }
    }
  }
  return 0;
}
