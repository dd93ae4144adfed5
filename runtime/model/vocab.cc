#include "runtime/model/vocab.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <optional>

#include "common/error.h"
#include "runtime/model/pretokenizer.h"
#include "runtime/model/token_table.h"
#include "runtime/model/unicode.h"
#include "runtime/model/vocab_bpe.h"
#include "runtime/model/vocab_spm.h"

namespace choreo::model {

namespace {

constexpr std::string_view kEscapedSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

// Token texts llama.cpp recognises when the metadata does not name the token. Where it stops at the first
// token it meets in hash order, we take the first text of the list the vocabulary has, which is
// deterministic.
const std::vector<std::string_view> kEotTexts = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",         "<|endoftext|>",     "<|end_of_text|>",
    "<EOT>",      "_<EOT>",     "[EOT]",   "<｜end▁of▁sentence｜>", "<end_of_utterance>"};
const std::vector<std::string_view> kEomTexts = {"<|eom_id|>"};
const std::vector<std::string_view> kFimPreTexts = {"<|fim_prefix|>",  "<fim-prefix>", "<fim_prefix>",
                                                    "<｜fim▁begin｜>", "<PRE>",        "▁<PRE>",
                                                    "<|code_prefix|>", "<|prefix|>"};
const std::vector<std::string_view> kFimSufTexts = {"<|fim_suffix|>",  "<fim-suffix>", "<fim_suffix>",
                                                    "<｜fim▁hole｜>",  "<SUF>",        "▁<SUF>",
                                                    "<|code_suffix|>", "<|suffix|>"};
const std::vector<std::string_view> kFimMidTexts = {"<|fim_middle|>",  "<fim-middle>", "<fim_middle>",
                                                    "<｜fim▁end｜>",   "<MID>",        "▁<MID>",
                                                    "<|code_middle|>", "<|middle|>"};
const std::vector<std::string_view> kFimPadTexts = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>",
                                                    "[PAD]"};
const std::vector<std::string_view> kFimRepTexts = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>",
                                                    "<reponame>"};
const std::vector<std::string_view> kFimSepTexts = {"<|file_sep|>"};
// Every token with one of these texts ends generation.
// clang-format off
const std::vector<std::string_view> kEogTexts = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~["};
// clang-format on

uint8_t attr_from_type(int64_t type) {
  switch (type) {  // tokenizer.ggml.token_type values (llama_token_type)
    case 1:
      return kAttrNormal;
    case 2:
      return kAttrUnknown;
    case 3:
      return kAttrControl;
    case 4:
      return kAttrUserDefined;
    case 5:
      return kAttrUnused;
    case 6:
      return kAttrByte;
    default:
      return kAttrUndefined;
  }
}

std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(text.size());
  for (size_t at = 0;;) {
    const size_t found = text.find(from, at);
    if (found == std::string_view::npos) {
      out.append(text.substr(at));
      return out;
    }
    out.append(text.substr(at, found - at));
    out.append(to);
    at = found + from.size();
  }
}

std::optional<uint8_t> parse_byte_token(std::string_view text) {  // "<0xAB>"
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return std::nullopt;
  int value = 0;
  for (const char c : text.substr(3, 2)) {
    const int digit = (c >= '0' && c <= '9')   ? c - '0'
                      : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                      : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                                               : -1;
    if (digit < 0) return std::nullopt;
    value = value * 16 + digit;
  }
  return uint8_t(value);
}

// Byte-level BPE tokens spell bytes with GPT-2's printable stand-ins; anything outside that map is kept as
// is.
std::string decode_bpe_text(std::string_view text) {
  std::string out;
  for (size_t offset = 0; offset < text.size();) {
    const Utf8Char c = decode_utf8(text, offset);
    const int byte = c.valid ? unicode_to_byte(c.codepoint) : -1;
    if (byte >= 0) {
      out.push_back(char(byte));
    } else {
      out.append(text.substr(offset, c.n_bytes));
    }
    offset += c.n_bytes;
  }
  return out;
}

}  // namespace

/// The loaded vocabulary; lives on the heap so the tokenizers may keep references to its table.
struct Vocab::Impl {
  std::string path;
  Kind kind = Kind::SPM;
  TokenTable table;
  std::unique_ptr<SpmTokenizer> spm;
  std::unique_ptr<BpeTokenizer> bpe;
  bool add_space_prefix = false;  // SPM: a space before the text and after every special token
  Token bos = -1, eos = -1, eot = -1, eom = -1, unknown = -1;
  Token fim_pad = -1, fim_rep = -1, fim_sep = -1;
  bool add_bos = false, add_eos = false;
  std::vector<Token> specials;  // control, user-defined and unknown tokens, longest text first
  std::vector<bool> eog;
  std::vector<std::string> pieces;  // token_to_piece(id, special = true)
  size_t longest_token_bytes = 1;
  std::array<bool, 256> kept_bytes{};  // bytes of raw text that always end up inside some token
  bool merges_make_tokens = true;      // BPE: every merge joins into a token of the table

  InputError error(std::string message, std::string hint = {}) const {
    return InputError(std::move(message), std::move(hint), SourceLocation{path});
  }

  void load_tokens(const gguf::File& file);
  void load_merges(const gguf::File& file, const BpeFlavor& flavor);
  Token read_id(const gguf::File& file, std::string_view key, Token fallback) const;
  Token detect(const std::vector<std::string_view>& texts, bool mark_control);
  void find_special_tokens(const gguf::File& file);
  void build_caches();
  void find_token_bounds();
  std::string render_piece(Token id) const;

  /// One piece of input after special tokens are split off: a token, or a byte range of raw text.
  struct Fragment {
    Token token;  // -1 for raw text
    size_t begin;
    size_t length;
  };
  std::vector<Fragment> partition(std::string_view text, bool parse_special) const;
  bool is_special_fragment(Token id) const {
    return table.has(id, kAttrControl | kAttrUserDefined | kAttrUnknown);
  }
};

void Vocab::Impl::load_tokens(const gguf::File& file) {
  const std::vector<std::string>& texts = file.get_string_array("tokenizer.ggml.tokens");
  if (texts.empty()) {
    throw error("missing or empty tokenizer.ggml.tokens",
                "the file has no vocabulary; use a GGUF with a tokenizer");
  }
  const size_t n = texts.size();
  if (n > size_t(std::numeric_limits<int32_t>::max())) throw error("tokenizer.ggml.tokens is too large");

  table.scores.assign(n, 0.0f);
  if (const gguf::Value* scores = file.find("tokenizer.ggml.scores")) {
    if (!scores->is_array() || scores->array_size() != n) {
      throw error(fmt::format("tokenizer.ggml.scores has {} entries for {} tokens", scores->array_size(), n));
    }
    if (scores->floats.size() == n) {
      for (size_t i = 0; i < n; ++i) table.scores[i] = float(scores->floats[i]);
    } else if (scores->ints.size() == n) {  // llama.cpp also accepts integer scores
      for (size_t i = 0; i < n; ++i) table.scores[i] = float(scores->ints[i]);
    } else {
      throw error("tokenizer.ggml.scores is not an array of numbers");
    }
  }
  table.attrs.assign(n, kAttrNormal);
  if (file.has("tokenizer.ggml.token_type")) {
    const std::vector<int64_t>& types = file.get_int_array("tokenizer.ggml.token_type");
    if (types.size() != n) {
      throw error(fmt::format("tokenizer.ggml.token_type has {} entries for {} tokens", types.size(), n));
    }
    for (size_t i = 0; i < n; ++i) table.attrs[i] = attr_from_type(types[i]);
  }

  table.texts.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    table.texts.push_back(texts[i].empty() ? fmt::format("[EMPTY_{}]", i) : texts[i]);  // as llama.cpp does
  }
  table.index.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const auto [it, inserted] = table.index.emplace(table.texts[i], Token(i));
    if (!inserted) {
      throw error(
          fmt::format("tokenizer.ggml.tokens has '{}' twice (ids {} and {})", table.texts[i], it->second, i));
    }
  }
}

void Vocab::Impl::load_merges(const gguf::File& file, const BpeFlavor& flavor) {
  if (!file.has("tokenizer.ggml.merges")) {
    throw error("missing tokenizer.ggml.merges", "a \"gpt2\" (byte-level BPE) vocabulary needs its merges");
  }
  const std::vector<std::string>& merges = file.get_string_array("tokenizer.ggml.merges");
  MergeRanks ranks;
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& line = merges[i];
    const size_t space = line.find(' ', 1);  // from 1: a merge may start with a space token
    if (space == std::string::npos) {
      throw error(
          fmt::format("tokenizer.ggml.merges[{}] = '{}' is not two tokens separated by a space", i, line));
    }
    const std::string_view left = std::string_view(line).substr(0, space);
    const std::string_view right = std::string_view(line).substr(space + 1);
    const Token left_id = table.find(left);
    const Token right_id = table.find(right);
    if (left_id < 0 || right_id < 0) {
      throw error(fmt::format("tokenizer.ggml.merges[{}] = '{}' refers to unknown token '{}'", i, line,
                              left_id < 0 ? left : right));
    }
    ranks.add(left_id, right_id, int32_t(i));
    if (merges_make_tokens)
      merges_make_tokens = table.find(line.substr(0, space) + line.substr(space + 1)) >= 0;
  }
  bpe = std::make_unique<BpeTokenizer>(table, std::move(ranks), PreTokenizer(flavor.regexes),
                                       flavor.ignore_merges);
}

Token Vocab::Impl::read_id(const gguf::File& file, std::string_view key, Token fallback) const {
  if (!file.has(key)) return fallback;
  const int64_t id = file.get_int(key, -1);
  // -1 (often stored as 0xFFFFFFFF) means "not set": llama.cpp keeps its default then.
  if (id < 0 || id == int64_t(std::numeric_limits<uint32_t>::max())) return fallback;
  if (id >= table.size()) {
    throw error(fmt::format("{} = {} is outside the vocabulary (0..{})", key, id, table.size() - 1));
  }
  return Token(id);
}

Token Vocab::Impl::detect(const std::vector<std::string_view>& texts, bool mark_control) {
  for (std::string_view text : texts) {
    const Token id = table.find(text);
    if (id < 0) continue;
    if (mark_control) table.attrs[size_t(id)] |= kAttrControl;  // llama.cpp overrides such types too
    return id;
  }
  return -1;
}

void Vocab::Impl::find_special_tokens(const gguf::File& file) {
  bos = read_id(file, "tokenizer.ggml.bos_token_id", bos);
  eos = read_id(file, "tokenizer.ggml.eos_token_id", eos);
  eot = read_id(file, "tokenizer.ggml.eot_token_id", eot);
  eom = read_id(file, "tokenizer.ggml.eom_token_id", eom);
  unknown = read_id(file, "tokenizer.ggml.unknown_token_id", unknown);
  fim_pad = read_id(file, "tokenizer.ggml.fim_pad_token_id", -1);
  fim_rep = read_id(file, "tokenizer.ggml.fim_rep_token_id", -1);
  fim_sep = read_id(file, "tokenizer.ggml.fim_sep_token_id", -1);

  add_bos = file.get_bool("tokenizer.ggml.add_bos_token", add_bos);
  add_eos = file.get_bool("tokenizer.ggml.add_eos_token", add_eos);
  if (add_bos && bos < 0)
    throw error("tokenizer.ggml.add_bos_token is true, but the vocabulary has no BOS token");
  if (add_eos && eos < 0)
    throw error("tokenizer.ggml.add_eos_token is true, but the vocabulary has no EOS token");

  if (eot < 0) eot = detect(kEotTexts, true);
  if (eom < 0) eom = detect(kEomTexts, true);
  const Token fim_pre = read_id(file, "tokenizer.ggml.fim_pre_token_id", -1);
  const Token fim_suf = read_id(file, "tokenizer.ggml.fim_suf_token_id", -1);
  const Token fim_mid = read_id(file, "tokenizer.ggml.fim_mid_token_id", -1);
  if (fim_pre < 0) detect(kFimPreTexts, true);
  if (fim_suf < 0) detect(kFimSufTexts, true);
  if (fim_mid < 0) detect(kFimMidTexts, true);
  if (fim_pad < 0) fim_pad = detect(kFimPadTexts, true);
  if (fim_rep < 0) fim_rep = detect(kFimRepTexts, true);
  if (fim_sep < 0) fim_sep = detect(kFimSepTexts, true);

  for (Token id = 0; id < table.size(); ++id) {
    uint8_t& attr = table.attrs[size_t(id)];
    if ((attr & kAttrControl) && table.texts[size_t(id)].find("unused") != std::string::npos)
      attr |= kAttrUnused;
    const std::string& text = table.texts[size_t(id)];
    // gpt-oss's channel markup must always render, so llama.cpp makes these tokens user-defined.
    if (text == "<|channel|>" || text == "<|message|>" || text == "<|start|>" || text == "<|constrain|>") {
      attr = kAttrUserDefined;
    }
  }

  eog.assign(size_t(table.size()), false);
  for (const Token id : {fim_pad, fim_rep, fim_sep, eos, eot, eom}) {
    if (id >= 0) eog[size_t(id)] = true;
  }
  for (std::string_view text : kEogTexts) {
    const Token id = table.find(text);
    if (id < 0) continue;
    eog[size_t(id)] = true;
    table.attrs[size_t(id)] |= kAttrControl;
  }
  // Harmony-style vocabularies (gpt-oss, solar-open) use <|end|> between messages, not to stop.
  const auto eog_has = [&](std::string_view text) {
    const Token id = table.find(text);
    return id >= 0 && eog[size_t(id)];
  };
  if (eog_has("<|end|>") && ((eog_has("<|return|>") && (eog_has("<|call|>") || eog_has("<|calls|>"))) ||
                             ((eog_has("<|call|>") || eog_has("<|calls|>")) && eog_has("<|flush|>")))) {
    const Token end = table.find("<|end|>");
    eog[size_t(end)] = false;
    table.attrs[size_t(end)] = kAttrUserDefined;
  }
  if (eog_has("<|tool_response>") && eog_has("</s>")) {  // Gemma 4 uses </s> inside turns
    const Token s = table.find("</s>");
    eog[size_t(s)] = false;
    table.attrs[size_t(s)] = kAttrNormal;
  }
}

std::string Vocab::Impl::render_piece(Token id) const {
  const uint8_t attr = table.attrs[size_t(id)];
  const std::string& text = table.texts[size_t(id)];
  if (attr & (kAttrUnknown | kAttrControl | kAttrUserDefined)) return text;
  if (attr & kAttrNormal) {
    return kind == Kind::SPM ? replace_all(text, kEscapedSpace, " ") : decode_bpe_text(text);
  }
  if (attr & kAttrByte) {
    const std::optional<uint8_t> byte = parse_byte_token(text);
    return byte ? std::string(1, char(*byte)) : text;
  }
  return {};  // undefined and unused tokens render as nothing, as in llama.cpp
}

void Vocab::Impl::build_caches() {
  for (Token id = 0; id < table.size(); ++id) {
    if (is_special_fragment(id)) specials.push_back(id);
  }
  std::stable_sort(specials.begin(), specials.end(), [&](Token a, Token b) {
    return table.texts[size_t(a)].size() > table.texts[size_t(b)].size();
  });
  pieces.reserve(size_t(table.size()));
  for (Token id = 0; id < table.size(); ++id) pieces.push_back(render_piece(id));
}

// llama.cpp's tokenizer_st_partition: for each special token, longest first, every raw fragment is cut
// at each occurrence. Control and unknown tokens take part only with parse_special; user-defined ones always.
std::vector<Vocab::Impl::Fragment> Vocab::Impl::partition(std::string_view text, bool parse_special) const {
  std::vector<Fragment> fragments;
  if (!text.empty()) fragments.push_back({-1, 0, text.size()});
  std::vector<Fragment> next;
  for (const Token id : specials) {
    if (!parse_special && table.has(id, kAttrControl | kAttrUnknown)) continue;
    const std::string& special = table.texts[size_t(id)];
    if (text.find(special) == std::string_view::npos) continue;
    next.clear();
    for (const Fragment& fragment : fragments) {
      if (fragment.token >= 0) {
        next.push_back(fragment);
        continue;
      }
      const std::string_view raw = text.substr(fragment.begin, fragment.length);
      size_t at = 0;
      for (size_t found; (found = raw.find(special, at)) != std::string_view::npos;
           at = found + special.size()) {
        if (found > at) next.push_back({-1, fragment.begin + at, found - at});
        next.push_back({id, 0, 0});
      }
      if (at < raw.size()) next.push_back({-1, fragment.begin + at, raw.size() - at});
    }
    fragments.swap(next);
  }
  return fragments;
}

Vocab::Vocab() : impl_(std::make_unique<Impl>()) {}
Vocab::Vocab(Vocab&&) noexcept = default;
Vocab& Vocab::operator=(Vocab&&) noexcept = default;
Vocab::~Vocab() = default;

Vocab Vocab::from_gguf(const gguf::File& file) {
  Vocab vocab;
  Impl& v = *vocab.impl_;
  v.path = file.path();
  if (!file.has("tokenizer.ggml.model")) {
    throw v.error("missing tokenizer.ggml.model", "the file has no vocabulary; use a GGUF with a tokenizer");
  }
  const std::string model = file.get_string("tokenizer.ggml.model", "");
  const BpeFlavor* flavor = nullptr;
  if (model == "llama") {
    v.kind = Kind::SPM;
  } else if (model == "gpt2") {
    v.kind = Kind::BPE;
    const std::string pre = file.get_string("tokenizer.ggml.pre", "");
    flavor = find_bpe_flavor(pre);
    if (!flavor) {
      throw v.error(fmt::format("unknown pre-tokenizer tokenizer.ggml.pre = '{}'", pre),
                    "supported: " + known_bpe_flavor_names());
    }
  } else {
    throw v.error(fmt::format("unsupported tokenizer.ggml.model = '{}'", model),
                  "choreo reads \"llama\" (SentencePiece) and \"gpt2\" (byte-level BPE) vocabularies");
  }

  v.load_tokens(file);
  // llama.cpp's defaults per tokenizer type; an id past the end of a small vocabulary is dropped.
  const auto in_range = [&](Token id) { return id < v.table.size() ? id : Token(-1); };
  if (v.kind == Kind::SPM) {
    v.bos = in_range(1);
    v.eos = in_range(2);
    v.unknown = in_range(0);
    v.add_bos = true;
    v.add_space_prefix = file.get_bool("tokenizer.ggml.add_space_prefix", true);
  } else {
    v.bos = flavor->has_bos ? in_range(11) : -1;
    v.eos = in_range(11);
    v.add_bos = flavor->add_bos;
    v.load_merges(file, *flavor);
  }
  v.find_special_tokens(file);
  v.build_caches();
  if (v.kind == Kind::SPM) v.spm = std::make_unique<SpmTokenizer>(v.table, v.unknown);
  v.find_token_bounds();
  return vocab;
}

// What min_tokens counts on. SentencePiece: a character that is not a token falls back to its bytes, each a
// byte token, the unknown token or nothing; a space is written as U+2581 first, three bytes, counted when the
// U+2581 token exists or one of its bytes is kept. Byte-level BPE: a byte's stand-in character starts as its
// own symbol and merges keep it inside a token, unless a merge joins into text that is not a token (no real
// vocabulary has one), after which only ASCII stand-ins are looked up alone. Special tokens are matched in
// the raw text, their spelling as long as what they stand for.
void Vocab::Impl::find_token_bounds() {
  for (const std::string& text : table.texts)
    longest_token_bytes = std::max(longest_token_bytes, text.size());
  for (int byte = 0; byte < 256; ++byte) {
    if (kind == Kind::SPM) {
      kept_bytes[size_t(byte)] = spm->always_tokenised(uint8_t(byte));
    } else {
      const std::string_view stand_in = byte_to_unicode(uint8_t(byte));
      kept_bytes[size_t(byte)] = table.find(stand_in) >= 0 && (merges_make_tokens || stand_in.size() == 1);
    }
  }
  if (kind == Kind::SPM) {
    bool space_kept = table.find(kEscapedSpace) >= 0;
    for (const char byte : kEscapedSpace) space_kept = space_kept || spm->always_tokenised(uint8_t(byte));
    kept_bytes[uint8_t(' ')] = space_kept;
  }
}

Vocab::Kind Vocab::kind() const { return impl_->kind; }
int Vocab::n_tokens() const { return impl_->table.size(); }
Token Vocab::bos() const { return impl_->bos; }
Token Vocab::eos() const { return impl_->eos; }
Token Vocab::eot() const { return impl_->eot; }
bool Vocab::add_bos() const { return impl_->add_bos; }
bool Vocab::add_eos() const { return impl_->add_eos; }
Token Vocab::find(std::string_view text) const { return impl_->table.find(text); }

bool Vocab::is_eog(Token id) const { return id >= 0 && id < n_tokens() && impl_->eog[size_t(id)]; }
bool Vocab::is_control(Token id) const {
  return id >= 0 && id < n_tokens() && impl_->table.has(id, kAttrControl);
}

const std::string& Vocab::token_text(Token id) const {
  if (id < 0 || id >= n_tokens()) {
    throw InputError(fmt::format("token id {} is outside the vocabulary (0..{})", id, n_tokens() - 1));
  }
  return impl_->table.texts[size_t(id)];
}

std::vector<Token> Vocab::tokenize(std::string_view text, bool add_special, bool parse_special) const {
  const Impl& v = *impl_;
  std::vector<Token> out;
  if (add_special && v.add_bos) out.push_back(v.bos);
  bool after_special = true;  // SPM puts a space before the first text and before text after a special token
  std::string escaped;
  for (const Impl::Fragment& fragment : v.partition(text, parse_special)) {
    if (fragment.token >= 0) {
      out.push_back(fragment.token);
      after_special = true;
      continue;
    }
    const std::string_view raw = text.substr(fragment.begin, fragment.length);
    if (v.kind == Kind::SPM) {
      escaped.clear();
      if (v.add_space_prefix && after_special) escaped = kEscapedSpace;
      escaped += replace_all(raw, " ", kEscapedSpace);
      v.spm->encode(escaped, out);
    } else {
      v.bpe->encode(raw, out);
    }
    after_special = false;
  }
  if (add_special && v.add_eos) out.push_back(v.eos);
  return out;
}

size_t Vocab::min_tokens(std::string_view text) const {
  size_t kept = 0;
  for (const char byte : text) kept += impl_->kept_bytes[uint8_t(byte)] ? 1 : 0;
  return (kept + impl_->longest_token_bytes - 1) / impl_->longest_token_bytes;
}

size_t Vocab::longest_token_bytes() const { return impl_->longest_token_bytes; }

std::string Vocab::token_to_piece(Token id, bool special) const {
  const Impl& v = *impl_;
  token_text(id);  // range check
  if (!special && v.table.has(id, kAttrUnknown | kAttrControl)) return {};
  return v.pieces[size_t(id)];
}

std::string Vocab::detokenize(std::span<const Token> ids, bool special) const {
  const Impl& v = *impl_;
  const bool spm_prefix = v.kind == Kind::SPM && v.add_space_prefix;
  std::string out;
  bool strip_space = spm_prefix;  // undo the space tokenize() put at the start and after special tokens
  for (const Token id : ids) {
    const std::string piece = token_to_piece(id, special);
    if (v.is_special_fragment(id)) {
      out += piece;
      strip_space = spm_prefix;
      continue;
    }
    if (piece.empty()) continue;
    out.append(piece, strip_space && piece.front() == ' ' ? 1 : 0);
    strip_space = false;
  }
  return out;
}

}  // namespace choreo::model
