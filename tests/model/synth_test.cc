// Synthetic models: published shapes, a small shape written and re-read, determinism, and quantised weights
// that decode to the float weights drawn from the same seed.

#include "runtime/model/synth.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <set>

#include "kernels/quant.h"
#include "common/error.h"
#include "runtime/model/gguf.h"

using choreo::InputError;
using choreo::gguf::File;
using choreo::kernels::DType;
using choreo::model::SynthShape;
using choreo::model::SynthVocab;

namespace {

/// A tiny shape with every feature: GQA, untied output, Llama-3 rope scaling.
SynthShape small_shape() {
  return {.name = "test-small",
          .embedding_length = 64,
          .block_count = 2,
          .head_count = 4,
          .head_count_kv = 2,
          .feed_forward_length = 96,
          .vocab_size = 1200,
          .context_length = 512,
          .rope_freq_base = 500000.0,
          .rms_norm_epsilon = 1e-5,
          .tied_embeddings = false,
          .vocab = SynthVocab::Llama3,
          .rope_scaling_factor = 32.0,
          .rope_low_freq_factor = 1.0,
          .rope_high_freq_factor = 4.0,
          .rope_original_context_length = 64};
}

struct TempDir {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("choreo_synth_test_" + std::to_string(getpid()));
  TempDir() { std::filesystem::create_directories(path); }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

/// IEEE half -> double, written out here so the test does not trust the code under test.
double half_to_double(uint16_t h) {
  int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

std::vector<float> as_floats(const choreo::gguf::TensorInfo& t) {
  std::vector<float> out(static_cast<size_t>(t.n_elements()));
  REQUIRE(t.type == DType::F32);
  std::memcpy(out.data(), t.data, t.n_bytes);
  return out;
}

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("synth: built-in shapes carry the published hyper-parameters and parameter counts") {
  auto names = choreo::model::synth_shape_names();
  CHECK(names == std::vector<std::string>{"smollm2-135m", "smollm2-360m", "tinyllama-1.1b", "llama-3.2-1b",
                                          "llama-3.2-3b", "llama-3.1-8b"});
  CHECK(choreo::model::find_synth_shape("gpt-5") == nullptr);
  const SynthShape* smol = choreo::model::find_synth_shape("smollm2-135m");
  REQUIRE(smol);
  CHECK(smol->embedding_length == 576);
  CHECK(smol->block_count == 30);
  CHECK(smol->head_count == 9);
  CHECK(smol->head_count_kv == 3);
  CHECK(smol->feed_forward_length == 1536);
  CHECK(smol->vocab_size == 49152);
  CHECK(smol->rope_freq_base == 100000.0);
  CHECK(smol->tied_embeddings);
  // Parameter counts as published by the model authors (134.5M, 1.24B, 8.03B).
  CHECK(choreo::model::synth_parameter_count(*smol) == 134515008);
  const SynthShape* l1 = choreo::model::find_synth_shape("llama-3.2-1b");
  REQUIRE(l1);
  CHECK(choreo::model::synth_parameter_count(*l1) == 1235814400);
  CHECK(l1->rope_scaling_factor == 32.0);
  CHECK(l1->rope_original_context_length == 8192);
  const SynthShape* l8 = choreo::model::find_synth_shape("llama-3.1-8b");
  REQUIRE(l8);
  CHECK(!l8->tied_embeddings);
  CHECK(choreo::model::synth_parameter_count(*l8) == 8030261248);
  for (const std::string& name : names) {
    const SynthShape* s = choreo::model::find_synth_shape(name);
    CHECK(s->embedding_length % 32 == 0);
    CHECK(s->feed_forward_length % 32 == 0);
    CHECK(s->embedding_length % s->head_count == 0);
    CHECK(s->head_count % s->head_count_kv == 0);
  }
}

TEST_CASE("synth: weight type names") {
  CHECK(choreo::model::synth_weight_type("q8_0") == DType::Q8_0);
  CHECK(choreo::model::synth_weight_type("Q4_1") == DType::Q4_1);
  CHECK(choreo::model::synth_weight_type("bf16") == DType::BF16);
  CHECK_THROWS_WITH_AS(choreo::model::synth_weight_type("q4_k"),
                       doctest::Contains("unknown weight type 'q4_k'"), InputError);
}

TEST_CASE(
    "synth: a small shape re-reads with llama.cpp's metadata, tensor names and shapes, and vocabulary") {
  TempDir dir;
  const SynthShape s = small_shape();
  const std::string path = dir.file("small.gguf");
  choreo::model::write_synthetic_model(s, DType::Q8_0, path, 7);
  File f = File::open(path);
  CHECK(f.require_string("general.architecture") == "llama");
  CHECK(f.require_int("llama.embedding_length") == 64);
  CHECK(f.require_int("llama.block_count") == 2);
  CHECK(f.require_int("llama.attention.head_count") == 4);
  CHECK(f.require_int("llama.attention.head_count_kv") == 2);
  CHECK(f.require_int("llama.feed_forward_length") == 96);
  CHECK(f.require_int("llama.context_length") == 512);
  CHECK(f.require_int("llama.vocab_size") == 1200);
  CHECK(f.require_int("llama.rope.dimension_count") == 16);
  CHECK(f.get_float("llama.rope.freq_base", 0) == 500000.0);
  CHECK(f.get_float("llama.attention.layer_norm_rms_epsilon", 0) == doctest::Approx(1e-5));
  CHECK(f.require_int("general.file_type") == 7);  // LLAMA_FTYPE_MOSTLY_Q8_0
  CHECK(f.require_int("choreo.synth.seed") == 7);

  using S = std::vector<int64_t>;
  const size_t expected_tensors = 1 + 1 + 9 * 2 + 1 + 1;  // embd, rope_freqs, layers, output_norm, output
  CHECK(f.tensors().size() == expected_tensors);
  auto check = [&](const std::string& name, S shape, DType type) {
    const auto* t = f.tensor(name);
    REQUIRE_MESSAGE(t, name);
    CHECK_MESSAGE(t->shape == shape, name);
    CHECK_MESSAGE(t->type == type, name);
  };
  check("token_embd.weight", {64, 1200}, DType::Q8_0);
  check("output.weight", {64, 1200}, DType::Q8_0);
  check("output_norm.weight", {64}, DType::F32);
  check("rope_freqs.weight", {8}, DType::F32);
  for (int layer = 0; layer < 2; ++layer) {
    std::string p = "blk." + std::to_string(layer) + ".";
    check(p + "attn_norm.weight", {64}, DType::F32);
    check(p + "ffn_norm.weight", {64}, DType::F32);
    check(p + "attn_q.weight", {64, 64}, DType::Q8_0);
    check(p + "attn_k.weight", {64, 32}, DType::Q8_0);
    check(p + "attn_v.weight", {64, 32}, DType::Q8_0);
    check(p + "attn_output.weight", {64, 64}, DType::Q8_0);
    check(p + "ffn_gate.weight", {64, 96}, DType::Q8_0);
    check(p + "ffn_up.weight", {64, 96}, DType::Q8_0);
    check(p + "ffn_down.weight", {96, 64}, DType::Q8_0);
  }

  // Vocabulary: unique tokens; ids 0..255 are the byte tokens; merges join existing tokens into existing
  // tokens.
  const auto& tokens = f.get_string_array("tokenizer.ggml.tokens");
  const auto& types = f.get_int_array("tokenizer.ggml.token_type");
  REQUIRE(tokens.size() == 1200);
  REQUIRE(types.size() == 1200);
  CHECK(std::set<std::string>(tokens.begin(), tokens.end()).size() == tokens.size());
  CHECK(tokens['a'] == "a");
  CHECK(tokens[' '] == "\xc4\xa0");   // U+0120 'Ġ'
  CHECK(tokens['\n'] == "\xc4\x8a");  // U+010A 'Ċ'
  CHECK(tokens[0] == "\xc4\x80");     // U+0100
  std::set<std::string> vocab(tokens.begin(), tokens.end());
  const auto& merges = f.get_string_array("tokenizer.ggml.merges");
  CHECK(merges.size() == 702);
  for (const std::string& m : merges) {
    size_t space = m.find(' ');
    REQUIRE(space != std::string::npos);
    CHECK(vocab.count(m.substr(0, space)));
    CHECK(vocab.count(m.substr(space + 1)));
    CHECK(vocab.count(m.substr(0, space) + m.substr(space + 1)));
  }
  CHECK(f.require_string("tokenizer.ggml.model") == "gpt2");
  CHECK(f.require_string("tokenizer.ggml.pre") == "default");
  const int64_t bos = f.require_int("tokenizer.ggml.bos_token_id");
  const int64_t eos = f.require_int("tokenizer.ggml.eos_token_id");
  CHECK(tokens[static_cast<size_t>(bos)] == "<|begin_of_text|>");
  CHECK(tokens[static_cast<size_t>(eos)] == "<|eot_id|>");
  CHECK(types[static_cast<size_t>(bos)] == 3);  // CONTROL
  CHECK(types[static_cast<size_t>(eos)] == 3);
  CHECK(f.get_bool("tokenizer.ggml.add_bos_token", false));
  CHECK(f.get_string("tokenizer.chat_template", "").find("<|start_header_id|>") != std::string::npos);
}

TEST_CASE("synth: rope_freqs follow Llama 3's scaled-frequency rule") {
  TempDir dir;
  const SynthShape s = small_shape();
  choreo::model::write_synthetic_model(s, DType::F32, dir.file("f.gguf"), 1);
  File f = File::open(dir.file("f.gguf"));
  std::vector<float> factors = as_floats(*f.tensor("rope_freqs.weight"));
  // Hugging Face's formulation: compute the new inverse frequency; the file stores old / new.
  const double dim = static_cast<double>(s.head_dim());
  const double low_wavelength = s.rope_original_context_length / s.rope_low_freq_factor;
  const double high_wavelength = s.rope_original_context_length / s.rope_high_freq_factor;
  bool saw_scaled = false, saw_unscaled = false, saw_smooth = false;
  for (size_t i = 0; i < factors.size(); ++i) {
    double inv_freq = std::pow(s.rope_freq_base, -2.0 * static_cast<double>(i) / dim);
    double wavelength = 2 * std::numbers::pi / inv_freq;
    double new_inv_freq = inv_freq;
    if (wavelength > low_wavelength) {
      new_inv_freq = inv_freq / s.rope_scaling_factor;
      saw_scaled = true;
    } else if (wavelength >= high_wavelength) {
      double smooth = (s.rope_original_context_length / wavelength - s.rope_low_freq_factor) /
                      (s.rope_high_freq_factor - s.rope_low_freq_factor);
      new_inv_freq = (1 - smooth) * inv_freq / s.rope_scaling_factor + smooth * inv_freq;
      saw_smooth = true;
    } else {
      saw_unscaled = true;
    }
    CHECK(factors[i] == doctest::Approx(inv_freq / new_inv_freq).epsilon(1e-6));
  }
  CHECK(saw_scaled);
  CHECK(saw_unscaled);
  CHECK(saw_smooth);
}

TEST_CASE("synth: same seed, same bytes, weights are N(0, 0.02) and norms near 1") {
  TempDir dir;
  SynthShape s = small_shape();
  s.vocab = SynthVocab::ChatML;
  s.rope_scaling_factor = 0;  // no rope_freqs
  s.tied_embeddings = true;
  choreo::model::write_synthetic_model(s, DType::F32, dir.file("a.gguf"), 123);
  choreo::model::write_synthetic_model(s, DType::F32, dir.file("b.gguf"), 123);
  choreo::model::write_synthetic_model(s, DType::F32, dir.file("c.gguf"), 124);
  CHECK(read_all(dir.file("a.gguf")) == read_all(dir.file("b.gguf")));
  File a = File::open(dir.file("a.gguf"));
  File c = File::open(dir.file("c.gguf"));
  CHECK(a.tensor("rope_freqs.weight") == nullptr);
  CHECK(a.tensor("output.weight") == nullptr);  // tied
  CHECK(a.tensors().size() == 1 + 9 * 2 + 1);
  std::vector<float> embd = as_floats(*a.tensor("token_embd.weight"));
  CHECK(embd != as_floats(*c.tensor("token_embd.weight")));
  // Different tensors are not copies of each other.
  CHECK(as_floats(*a.tensor("blk.0.attn_q.weight")) != as_floats(*a.tensor("blk.1.attn_q.weight")));
  double sum = 0, sum_squares = 0;
  for (float x : embd) {
    sum += x;
    sum_squares += static_cast<double>(x) * x;
  }
  const double n = static_cast<double>(embd.size());
  const double mean = sum / n, stddev = std::sqrt(sum_squares / n - mean * mean);
  CHECK(std::abs(mean) < 0.001);
  CHECK(stddev == doctest::Approx(0.02).epsilon(0.02));
  for (float x : as_floats(*a.tensor("output_norm.weight"))) CHECK(std::abs(x - 1.0f) < 0.1f);
  const auto& tokens = a.get_string_array("tokenizer.ggml.tokens");
  CHECK(tokens[static_cast<size_t>(a.require_int("tokenizer.ggml.bos_token_id"))] == "<|im_start|>");
  CHECK(tokens[static_cast<size_t>(a.require_int("tokenizer.ggml.eos_token_id"))] == "<|im_end|>");
  CHECK_FALSE(a.get_bool("tokenizer.ggml.add_bos_token", true));
}

TEST_CASE("synth: q8_0 weights decode to the f32 weights of the same seed") {
  TempDir dir;
  const SynthShape s = small_shape();
  choreo::model::write_synthetic_model(s, DType::F32, dir.file("f32.gguf"), 99);
  choreo::model::write_synthetic_model(s, DType::Q8_0, dir.file("q8.gguf"), 99);
  File f32 = File::open(dir.file("f32.gguf"));
  File q8 = File::open(dir.file("q8.gguf"));
  for (const char* name : {"token_embd.weight", "blk.1.ffn_down.weight", "output.weight"}) {
    CAPTURE(name);
    std::vector<float> reference = as_floats(*f32.tensor(name));
    const auto* t = q8.tensor(name);
    REQUIRE(t->type == DType::Q8_0);
    REQUIRE(t->n_bytes == reference.size() / 32 * 34);
    size_t bad = 0;
    for (size_t block = 0; block < reference.size() / 32; ++block) {
      const uint8_t* b = t->data + block * 34;
      double scale = half_to_double(static_cast<uint16_t>(b[0] | (b[1] << 8)));
      double max_abs = 0;
      for (int i = 0; i < 32; ++i)
        max_abs = std::max(max_abs, std::abs(static_cast<double>(reference[block * 32 + i])));
      if (std::abs(scale - max_abs / 127) > max_abs / 127 * 1e-3) ++bad;
      for (int i = 0; i < 32; ++i) {
        double decoded = scale * static_cast<int8_t>(b[2 + i]);
        // Rounding to the nearest step of the exact scale, plus up to 127 times the fp16 rounding of the
        // scale.
        double exact_scale = max_abs / 127;
        double bound = 0.5 * exact_scale + 127 * std::abs(scale - exact_scale) + 1e-6 * exact_scale;
        if (std::abs(decoded - reference[block * 32 + i]) > bound) ++bad;
      }
    }
    CHECK(bad == 0);
  }
  // Norms are F32 in every file, identical across types.
  CHECK(as_floats(*f32.tensor("blk.0.attn_norm.weight")) == as_floats(*q8.tensor("blk.0.attn_norm.weight")));
}

TEST_CASE("synth: every writable type round-trips through the reader close to the f32 weights") {
  TempDir dir;
  SynthShape s = small_shape();
  choreo::model::write_synthetic_model(s, DType::F32, dir.file("f32.gguf"), 5);
  File reference_file = File::open(dir.file("f32.gguf"));
  std::vector<float> reference = as_floats(*reference_file.tensor("blk.0.ffn_gate.weight"));
  struct Case {
    DType type;
    double tolerance;  // absolute, for weights of std 0.02 bounded by 0.07 (q4_0 clamps one end: a full step)
    int64_t file_type;
  };
  for (Case c : {Case{DType::F16, 4e-5, 1}, Case{DType::BF16, 3e-4, 32}, Case{DType::Q8_0, 4e-4, 7},
                 Case{DType::Q4_0, 1e-2, 2}, Case{DType::Q4_1, 6e-3, 3}}) {
    CAPTURE(choreo::kernels::type_traits(c.type).name);
    std::string path = dir.file("t.gguf");
    choreo::model::write_synthetic_model(s, c.type, path, 5);
    File f = File::open(path);
    CHECK(f.require_int("general.file_type") == c.file_type);
    const auto* t = f.tensor("blk.0.ffn_gate.weight");
    REQUIRE(t->type == c.type);
    std::vector<float> decoded(reference.size());
    choreo::kernels::dequantize_row(c.type, t->data, decoded.data(), static_cast<int64_t>(decoded.size()));
    double worst = 0;
    for (size_t i = 0; i < decoded.size(); ++i)
      worst = std::max(worst, std::abs(double(decoded[i]) - reference[i]));
    CHECK(worst < c.tolerance);
    CHECK(worst > 0);
  }
}

TEST_CASE("synth: inconsistent shapes and unwritable types are input errors") {
  TempDir dir;
  SynthShape s = small_shape();
  s.embedding_length = 48;  // not a multiple of the 32-element block
  s.head_count = 4;
  s.head_count_kv = 2;
  CHECK_THROWS_WITH_AS(choreo::model::write_synthetic_model(s, DType::Q8_0, dir.file("x.gguf"), 1),
                       doctest::Contains("not a multiple of the Q8_0 block size 32"), InputError);
  s = small_shape();
  s.head_count_kv = 3;
  CHECK_THROWS_WITH_AS(choreo::model::write_synthetic_model(s, DType::F32, dir.file("x.gguf"), 1),
                       doctest::Contains("head_count is not a multiple of head_count_kv"), InputError);
  s = small_shape();
  s.vocab_size = 100;
  CHECK_THROWS_AS(choreo::model::write_synthetic_model(s, DType::F32, dir.file("x.gguf"), 1), InputError);
  CHECK_THROWS_WITH_AS(
      choreo::model::write_synthetic_model(small_shape(), DType::Q5_0, dir.file("x.gguf"), 1),
      doctest::Contains("cannot write weights of type Q5_0"), InputError);
  CHECK_FALSE(std::filesystem::exists(dir.file("x.gguf")));
}
