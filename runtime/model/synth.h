#pragma once
// Random-weight GGUF models of real shapes (`choreo model synth`), for speed tests without downloads.
//
// What a synthetic file contains (llama architecture, named exactly as llama.cpp's convert_hf_to_gguf.py
// names things, so llama.cpp and choreo both load it):
//
// Metadata
//   general.architecture = "llama", general.type = "model", general.name = "<shape> (synthetic random
//   weights)", llama.block_count, llama.context_length, llama.embedding_length, llama.feed_forward_length,
//   llama.attention.head_count, llama.attention.head_count_kv, llama.rope.freq_base (f32),
//   llama.attention.layer_norm_rms_epsilon (f32), general.file_type (llama_ftype of the matrix type),
//   llama.vocab_size, llama.rope.dimension_count (= head size), general.quantization_version = 2,
//   choreo.synth.shape (string) and choreo.synth.seed (uint64) for provenance. Integers are uint32 unless
//   noted.
//
// Tensors (ggml order, shape[0] contiguous)
//   token_embd.weight [dim, vocab]; rope_freqs.weight [head_dim/2] f32 (only with Llama-3 rope scaling);
//   per layer N: blk.N.attn_norm.weight [dim], blk.N.attn_q.weight [dim, heads*head_dim],
//   blk.N.attn_k.weight / attn_v.weight [dim, kv_heads*head_dim], blk.N.attn_output.weight [heads*head_dim,
//   dim], blk.N.ffn_norm.weight [dim], blk.N.ffn_gate.weight / ffn_up.weight [dim, ffn],
//   blk.N.ffn_down.weight [ffn, dim]; output_norm.weight [dim]; output.weight [dim, vocab] only when
//   embeddings are untied. Norms and rope_freqs are F32; every matrix has the requested type, encoded by
//   kernels::quantize_row.
//
// Weights
//   Matrices ~ N(0, 0.02^2) and norms ~ 1 + N(0, 0.02^2), approximately normal (a centred sum of four uniform
//   variates, so tails are bounded at 3.46 sigma). Every row is drawn from its own generator seeded by
//   (seed, tensor name, row), so the values are the same whatever the output type, thread count or order, and
//   the file is written row by row straight into its mapping (an 8B model never sits in memory).
//   rope_freqs holds Llama 3's per-frequency divisors: with wavelength w_i = 2*pi*base^(2i/head_dim),
//   1 where w_i < orig_ctx/high_freq_factor, `factor` where w_i > orig_ctx/low_freq_factor, and otherwise
//   1 / ((1 - s)/factor + s) with s = (orig_ctx/w_i - low_freq_factor) / (high_freq_factor -
//   low_freq_factor).
//
// Vocabulary (byte-level BPE, loadable by llama.cpp): tokenizer.ggml.model = "gpt2", tokenizer.ggml.pre =
//   "default", tokenizer.ggml.tokens / token_type (int32) / merges, bos/eos ids, add_bos_token. Ids:
//   0..255      the 256 GPT-2 byte tokens: id b is bytes_to_unicode(b) (e.g. 32 -> "Ġ", 10 -> "Ċ"), NORMAL;
//   256..       merge results: "Ġa".."Ġz" then "aa".."zz" (702 tokens, fewer if the vocab is tiny), NORMAL,
//               with merges "Ġ a".."Ġ z", "a a".."z z" in that rank order;
//   ..          fillers "<filler_ID>" (ID = the token id) up to the specials, NORMAL (never produced by
//   merges); last ids    the family's special tokens, CONTROL:
//               chatml (SmolLM2): <|endoftext|>, <|im_start|> (bos), <|im_end|> (eos); add_bos_token = false;
//               llama3: <|begin_of_text|> (bos), <|end_of_text|>, <|start_header_id|>, <|end_header_id|>,
//                       <|eot_id|> (eos); add_bos_token = true;
//               llama2 (TinyLlama): <unk>, <s> (bos), </s> (eos); add_bos_token = true.
//   chatml and llama3 shapes also get a minimal tokenizer.chat_template in that family's format.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/dtype.h"

namespace choreo::model {

/// Which special tokens (and chat template) a synthetic vocabulary carries.
enum class SynthVocab { ChatML, Llama3, Llama2 };

/// Hyper-parameters of a real model, for writing a random-weight GGUF of exactly its shape.
struct SynthShape {
  std::string_view name;         // e.g. "llama-3.2-1b"
  int64_t embedding_length = 0;  // model dimension
  int64_t block_count = 0;       // layers
  int64_t head_count = 0;        // query heads
  int64_t head_count_kv = 0;     // key/value heads (GQA)
  int64_t feed_forward_length = 0;
  int64_t vocab_size = 0;
  int64_t context_length = 0;
  double rope_freq_base = 10000.0;
  double rms_norm_epsilon = 1e-5;
  bool tied_embeddings = true;  // false: a separate output.weight is written
  SynthVocab vocab = SynthVocab::ChatML;
  /// Llama-3 rope scaling, written as rope_freqs.weight; rope_scaling_factor == 0 means none.
  double rope_scaling_factor = 0.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int64_t rope_original_context_length = 8192;

  int64_t head_dim() const { return embedding_length / head_count; }
};

/// The built-in shape with this name (see synth_shape_names), or nullptr.
const SynthShape* find_synth_shape(std::string_view name);

/// Names of the built-in shapes: smollm2-135m, smollm2-360m, tinyllama-1.1b, llama-3.2-1b, llama-3.2-3b,
/// llama-3.1-8b.
std::vector<std::string> synth_shape_names();

/// Parses a weight type name (f32|f16|bf16|q8_0|q4_0|q4_1, case-insensitive); InputError lists the choices.
kernels::DType synth_weight_type(std::string_view name);

/// Number of weights the file will hold (embeddings counted once when tied; rope_freqs, which are not
/// trained weights, not counted), i.e. the parameter count the model's authors publish.
int64_t synth_parameter_count(const SynthShape& shape);

/// SplitMix64's finaliser: a well-mixed 64-bit value from any 64-bit input.
uint64_t mix64(uint64_t z);
/// Fills `out` with mean + stddev * (approximately standard normal: a sum of four uniforms), from a generator
/// seeded by `row_seed` alone.
void random_normal_row(uint64_t row_seed, float mean, float stddev, std::span<float> out);

/// Writes the model described above to `path` (crash-safe). InputError for an inconsistent shape or a type
/// that cannot be written; RuntimeFailure for I/O failures.
void write_synthetic_model(const SynthShape& shape, kernels::DType type, const std::string& path,
                           uint64_t seed);

}  // namespace choreo::model
