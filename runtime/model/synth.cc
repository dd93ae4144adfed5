// Synthetic llama-architecture GGUFs; what is written is documented in synth.h.

#include "runtime/model/synth.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <numbers>
#include <span>
#include <thread>
#include <vector>

#include "kernels/quant.h"
#include "common/error.h"
#include "runtime/model/gguf.h"

namespace choreo::model {

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void random_normal_row(uint64_t row_seed, float mean, float stddev, std::span<float> out) {
  // Four 16-bit uniforms per 64-bit draw; their centred sum has variance 4/12, hence the sqrt(3).
  constexpr float kUnit = 1.0f / 65536.0f;
  const float scale = stddev * std::numbers::sqrt3_v<float>;
  uint64_t state = row_seed;
  for (float& x : out) {
    state += 0x9e3779b97f4a7c15ull;
    uint64_t r = mix64(state);
    float sum =
        static_cast<float>((r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48)) + 2.0f;
    x = mean + scale * (sum * kUnit - 2.0f);
  }
}

namespace {

// Published hyper-parameters (the models' config.json files).
constexpr std::array<SynthShape, 6> kShapes = {{
    {.name = "smollm2-135m",
     .embedding_length = 576,
     .block_count = 30,
     .head_count = 9,
     .head_count_kv = 3,
     .feed_forward_length = 1536,
     .vocab_size = 49152,
     .context_length = 8192,
     .rope_freq_base = 100000.0,
     .rms_norm_epsilon = 1e-5,
     .tied_embeddings = true,
     .vocab = SynthVocab::ChatML},
    {.name = "smollm2-360m",
     .embedding_length = 960,
     .block_count = 32,
     .head_count = 15,
     .head_count_kv = 5,
     .feed_forward_length = 2560,
     .vocab_size = 49152,
     .context_length = 8192,
     .rope_freq_base = 100000.0,
     .rms_norm_epsilon = 1e-5,
     .tied_embeddings = true,
     .vocab = SynthVocab::ChatML},
    {.name = "tinyllama-1.1b",
     .embedding_length = 2048,
     .block_count = 22,
     .head_count = 32,
     .head_count_kv = 4,
     .feed_forward_length = 5632,
     .vocab_size = 32000,
     .context_length = 2048,
     .rope_freq_base = 10000.0,
     .rms_norm_epsilon = 1e-5,
     .tied_embeddings = false,
     .vocab = SynthVocab::Llama2},
    {.name = "llama-3.2-1b",
     .embedding_length = 2048,
     .block_count = 16,
     .head_count = 32,
     .head_count_kv = 8,
     .feed_forward_length = 8192,
     .vocab_size = 128256,
     .context_length = 131072,
     .rope_freq_base = 500000.0,
     .rms_norm_epsilon = 1e-5,
     .tied_embeddings = true,
     .vocab = SynthVocab::Llama3,
     .rope_scaling_factor = 32.0,
     .rope_low_freq_factor = 1.0,
     .rope_high_freq_factor = 4.0,
     .rope_original_context_length = 8192},
    {.name = "llama-3.2-3b",
     .embedding_length = 3072,
     .block_count = 28,
     .head_count = 24,
     .head_count_kv = 8,
     .feed_forward_length = 8192,
     .vocab_size = 128256,
     .context_length = 131072,
     .rope_freq_base = 500000.0,
     .rms_norm_epsilon = 1e-5,
     .tied_embeddings = true,
     .vocab = SynthVocab::Llama3,
     .rope_scaling_factor = 32.0,
     .rope_low_freq_factor = 1.0,
     .rope_high_freq_factor = 4.0,
     .rope_original_context_length = 8192},
    {.name = "llama-3.1-8b",
     .embedding_length = 4096,
     .block_count = 32,
     .head_count = 32,
     .head_count_kv = 8,
     .feed_forward_length = 14336,
     .vocab_size = 128256,
     .context_length = 131072,
     .rope_freq_base = 500000.0,
     .rms_norm_epsilon = 1e-5,
     .tied_embeddings = false,
     .vocab = SynthVocab::Llama3,
     .rope_scaling_factor = 8.0,
     .rope_low_freq_factor = 1.0,
     .rope_high_freq_factor = 4.0,
     .rope_original_context_length = 8192},
}};

constexpr double kWeightStd = 0.02;
constexpr double kNormStd = 0.02;

// llama.cpp's llama_token_type values.
constexpr int32_t kTokenNormal = 1;
constexpr int32_t kTokenControl = 3;

/// llama_ftype for a file whose matrices are all of type t.
uint32_t file_type(kernels::DType t) {
  switch (t) {
    case kernels::DType::F32:
      return 0;
    case kernels::DType::F16:
      return 1;
    case kernels::DType::Q4_0:
      return 2;
    case kernels::DType::Q4_1:
      return 3;
    case kernels::DType::Q8_0:
      return 7;
    case kernels::DType::BF16:
      return 32;
    default:
      return 0;
  }
}

// ---- vocabulary -----------------------------------------------------------------------------------------

std::string utf8(uint32_t codepoint) {
  std::string out;
  if (codepoint < 0x80) {
    out += static_cast<char>(codepoint);
  } else if (codepoint < 0x800) {
    out += static_cast<char>(0xc0 | (codepoint >> 6));
    out += static_cast<char>(0x80 | (codepoint & 0x3f));
  } else {
    out += static_cast<char>(0xe0 | (codepoint >> 12));
    out += static_cast<char>(0x80 | ((codepoint >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (codepoint & 0x3f));
  }
  return out;
}

/// GPT-2's reversible byte -> printable character map: printable Latin-1 bytes map to themselves, the other
/// 68 bytes to U+0100.. in byte order.
std::array<std::string, 256> byte_tokens() {
  std::array<std::string, 256> tokens;
  uint32_t next_extra = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    tokens[b] = utf8(printable ? b : next_extra++);
  }
  return tokens;
}

struct SpecialTokens {
  std::vector<std::string> texts;
  size_t bos_index = 0;
  size_t eos_index = 0;
  bool add_bos = false;
  std::string chat_template;
};

SpecialTokens special_tokens(SynthVocab vocab) {
  switch (vocab) {
    case SynthVocab::ChatML:
      return {
          {"<|endoftext|>", "<|im_start|>", "<|im_end|>"},
          1,
          2,
          false,
          "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
          "{% endif %}"};
    case SynthVocab::Llama3:
      return {
          {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"},
          0,
          4,
          true,
          "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
          "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif "
          "%}"};
    case SynthVocab::Llama2:
      return {{"<unk>", "<s>", "</s>"}, 1, 2, true, ""};
  }
  return {};
}

struct Vocabulary {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
  uint32_t bos_id = 0;
  uint32_t eos_id = 0;
  SpecialTokens specials;
};

Vocabulary build_vocabulary(const SynthShape& shape) {
  Vocabulary v;
  v.specials = special_tokens(shape.vocab);
  const size_t n_vocab = static_cast<size_t>(shape.vocab_size);
  const size_t n_special = v.specials.texts.size();
  const size_t special_start = n_vocab - n_special;
  for (const std::string& b : byte_tokens()) {
    v.tokens.push_back(b);
    v.types.push_back(kTokenNormal);
  }
  const std::string space = utf8(0x120);  // "Ġ", GPT-2's image of ' '
  auto add_merge = [&](const std::string& left, const std::string& right) {
    if (v.tokens.size() >= special_start) return;
    v.merges.push_back(left + " " + right);
    v.tokens.push_back(left + right);
    v.types.push_back(kTokenNormal);
  };
  for (char c = 'a'; c <= 'z'; ++c) add_merge(space, std::string(1, c));
  for (char a = 'a'; a <= 'z'; ++a) {
    for (char b = 'a'; b <= 'z'; ++b) add_merge(std::string(1, a), std::string(1, b));
  }
  while (v.tokens.size() < special_start) {
    v.tokens.push_back(fmt::format("<filler_{}>", v.tokens.size()));
    v.types.push_back(kTokenNormal);
  }
  for (const std::string& s : v.specials.texts) {
    v.tokens.push_back(s);
    v.types.push_back(kTokenControl);
  }
  v.bos_id = static_cast<uint32_t>(special_start + v.specials.bos_index);
  v.eos_id = static_cast<uint32_t>(special_start + v.specials.eos_index);
  return v;
}

// ---- random weights -------------------------------------------------------------------------------------


uint64_t hash_name(std::string_view name) {
  return XXH3_64bits(name.data(), name.size());
}


/// A Fill that writes `rows` rows of `row_elements` random values encoded as `type`.
gguf::Writer::Fill random_fill(uint64_t tensor_seed, int64_t row_elements, int64_t rows, kernels::DType type,
                               float mean, float stddev) {
  return [=](std::span<uint8_t> out) {
    const size_t row_bytes = kernels::row_bytes(type, row_elements);
    // Every row depends on its index alone, so the rows are shared out over one thread per core.
    const auto fill_rows = [&](int64_t begin, int64_t end) {
      std::vector<float> values(static_cast<size_t>(row_elements));
      for (int64_t r = begin; r < end; ++r) {
        random_normal_row(mix64(tensor_seed ^ mix64(static_cast<uint64_t>(r))), mean, stddev, values);
        kernels::quantize_row(type, values.data(), out.data() + static_cast<size_t>(r) * row_bytes,
                              row_elements);
      }
    };
    const int64_t n_threads = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, std::max<int64_t>(rows, 1));
    std::vector<std::thread> helpers;
    for (int64_t t = 1; t < n_threads; ++t) helpers.emplace_back(fill_rows, rows * t / n_threads, rows * (t + 1) / n_threads);
    fill_rows(0, rows / n_threads);
    for (std::thread& h : helpers) h.join();
  };
}

/// Llama 3's rope frequency divisors (see synth.h).
std::vector<float> llama3_rope_factors(const SynthShape& s) {
  const int64_t head_dim = s.head_dim();
  const double low_wavelength = s.rope_original_context_length / s.rope_low_freq_factor;
  const double high_wavelength = s.rope_original_context_length / s.rope_high_freq_factor;
  std::vector<float> factors;
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    double frequency =
        1.0 / std::pow(s.rope_freq_base, static_cast<double>(2 * i) / static_cast<double>(head_dim));
    double wavelength = 2.0 * std::numbers::pi / frequency;
    double factor = 1.0;
    if (wavelength > low_wavelength) {
      factor = s.rope_scaling_factor;
    } else if (wavelength >= high_wavelength) {
      double smooth = (s.rope_original_context_length / wavelength - s.rope_low_freq_factor) /
                      (s.rope_high_freq_factor - s.rope_low_freq_factor);
      factor = 1.0 / ((1.0 - smooth) / s.rope_scaling_factor + smooth);
    }
    factors.push_back(static_cast<float>(factor));
  }
  return factors;
}

void validate(const SynthShape& s, kernels::DType type) {
  auto fail = [&](const std::string& what) {
    throw InputError(fmt::format("model synth: shape '{}': {}", s.name, what));
  };
  if (s.embedding_length <= 0 || s.block_count <= 0 || s.head_count <= 0 || s.head_count_kv <= 0 ||
      s.feed_forward_length <= 0 || s.context_length <= 0) {
    fail("every dimension must be positive");
  }
  if (s.embedding_length % s.head_count != 0) fail("embedding_length is not a multiple of head_count");
  if (s.head_count % s.head_count_kv != 0) fail("head_count is not a multiple of head_count_kv");
  if (s.head_dim() % 2 != 0) fail("the head size must be even for RoPE");
  if (s.vocab_size < 256 + static_cast<int64_t>(special_tokens(s.vocab).texts.size()) ||
      s.vocab_size > (int64_t{1} << 31)) {
    fail("vocab_size must hold the 256 byte tokens and the special tokens");
  }
  if (!kernels::is_supported(type)) {
    throw InputError(
        fmt::format("model synth: cannot write weights of type {}", kernels::type_traits(type).name),
        "use one of f32, f16, bf16, q8_0, q4_0, q4_1");
  }
  const int64_t block = kernels::type_traits(type).block_elems;
  for (int64_t row : {s.embedding_length, s.feed_forward_length, s.head_count * s.head_dim()}) {
    if (row % block != 0) {
      fail(fmt::format("a row of {} weights is not a multiple of the {} block size {}", row,
                       kernels::type_traits(type).name, block));
    }
  }
  if (s.rope_scaling_factor != 0.0 &&
      !(s.rope_scaling_factor > 0 && s.rope_high_freq_factor > s.rope_low_freq_factor &&
        s.rope_low_freq_factor > 0 && s.rope_original_context_length > 0)) {
    fail("inconsistent Llama-3 rope scaling parameters");
  }
}

}  // namespace

const SynthShape* find_synth_shape(std::string_view name) {
  for (const SynthShape& s : kShapes) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::vector<std::string> synth_shape_names() {
  std::vector<std::string> names;
  for (const SynthShape& s : kShapes) names.emplace_back(s.name);
  return names;
}

kernels::DType synth_weight_type(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (kernels::DType t : {kernels::DType::F32, kernels::DType::F16, kernels::DType::BF16,
                           kernels::DType::Q8_0, kernels::DType::Q4_0, kernels::DType::Q4_1}) {
    std::string type_name(kernels::type_traits(t).name);
    std::transform(type_name.begin(), type_name.end(), type_name.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    if (type_name == lower) return t;
  }
  throw InputError(fmt::format("unknown weight type '{}'", name),
                   "use one of f32, f16, bf16, q8_0, q4_0, q4_1");
}

int64_t synth_parameter_count(const SynthShape& s) {
  const int64_t dim = s.embedding_length, kv_dim = s.head_count_kv * s.head_dim(),
                q_dim = s.head_count * s.head_dim();
  const int64_t per_layer =
      2 * dim + dim * q_dim + 2 * dim * kv_dim + q_dim * dim + 3 * dim * s.feed_forward_length;
  return s.vocab_size * dim * (s.tied_embeddings ? 1 : 2) + dim + s.block_count * per_layer;
}

void write_synthetic_model(const SynthShape& s, kernels::DType type, const std::string& path, uint64_t seed) {
  validate(s, type);
  const Vocabulary vocab = build_vocabulary(s);
  gguf::Writer w;
  auto u32 = [](int64_t v) { return static_cast<uint32_t>(v); };
  w.set_string("general.architecture", "llama");
  w.set_string("general.type", "model");
  w.set_string("general.name", fmt::format("{} (synthetic random weights)", s.name));
  w.set_u32("llama.block_count", u32(s.block_count));
  w.set_u32("llama.context_length", u32(s.context_length));
  w.set_u32("llama.embedding_length", u32(s.embedding_length));
  w.set_u32("llama.feed_forward_length", u32(s.feed_forward_length));
  w.set_u32("llama.attention.head_count", u32(s.head_count));
  w.set_u32("llama.attention.head_count_kv", u32(s.head_count_kv));
  w.set_f32("llama.rope.freq_base", static_cast<float>(s.rope_freq_base));
  w.set_f32("llama.attention.layer_norm_rms_epsilon", static_cast<float>(s.rms_norm_epsilon));
  w.set_u32("general.file_type", file_type(type));
  w.set_u32("llama.vocab_size", u32(s.vocab_size));
  w.set_u32("llama.rope.dimension_count", u32(s.head_dim()));
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", "default");
  w.set_string_array("tokenizer.ggml.tokens", vocab.tokens);
  w.set_i32_array("tokenizer.ggml.token_type", vocab.types);
  w.set_string_array("tokenizer.ggml.merges", vocab.merges);
  w.set_u32("tokenizer.ggml.bos_token_id", vocab.bos_id);
  w.set_u32("tokenizer.ggml.eos_token_id", vocab.eos_id);
  w.set_bool("tokenizer.ggml.add_bos_token", vocab.specials.add_bos);
  w.set_bool("tokenizer.ggml.add_eos_token", false);
  if (!vocab.specials.chat_template.empty())
    w.set_string("tokenizer.chat_template", vocab.specials.chat_template);
  w.set_u32("general.quantization_version", 2);
  w.set_string("choreo.synth.shape", std::string(s.name));
  gguf::Value seed_value;
  seed_value.type = gguf::ValueType::UINT64;
  seed_value.scalar = seed;
  w.set("choreo.synth.seed", seed_value);

  const int64_t dim = s.embedding_length, ffn = s.feed_forward_length;
  const int64_t q_dim = s.head_count * s.head_dim(), kv_dim = s.head_count_kv * s.head_dim();
  auto matrix = [&](const std::string& name, int64_t columns, int64_t rows) {
    w.add_tensor(name, {columns, rows}, type,
                 random_fill(mix64(seed ^ hash_name(name)), columns, rows, type, 0.0f,
                             static_cast<float>(kWeightStd)));
  };
  auto norm = [&](const std::string& name) {
    w.add_tensor(name, {dim}, kernels::DType::F32,
                 random_fill(mix64(seed ^ hash_name(name)), dim, 1, kernels::DType::F32, 1.0f,
                             static_cast<float>(kNormStd)));
  };

  matrix("token_embd.weight", dim, s.vocab_size);
  if (s.rope_scaling_factor != 0.0) {
    std::vector<float> factors = llama3_rope_factors(s);
    std::vector<uint8_t> bytes(factors.size() * sizeof(float));
    std::memcpy(bytes.data(), factors.data(), bytes.size());
    w.add_tensor("rope_freqs.weight", {static_cast<int64_t>(factors.size())}, kernels::DType::F32,
                 std::move(bytes));
  }
  for (int64_t layer = 0; layer < s.block_count; ++layer) {
    const std::string p = fmt::format("blk.{}.", layer);
    norm(p + "attn_norm.weight");
    matrix(p + "attn_q.weight", dim, q_dim);
    matrix(p + "attn_k.weight", dim, kv_dim);
    matrix(p + "attn_v.weight", dim, kv_dim);
    matrix(p + "attn_output.weight", q_dim, dim);
    norm(p + "ffn_norm.weight");
    matrix(p + "ffn_gate.weight", dim, ffn);
    matrix(p + "ffn_up.weight", dim, ffn);
    matrix(p + "ffn_down.weight", ffn, dim);
  }
  norm("output_norm.weight");
  if (!s.tied_embeddings) matrix("output.weight", dim, s.vocab_size);
  w.write(path);
}

}  // namespace choreo::model
