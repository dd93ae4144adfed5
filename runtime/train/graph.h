#pragma once
// The differentiable forward pass of a choreographed run (issue 13, DESIGN.md §9): a list of messages, each
// encoded over parents placed at offsets (DESIGN.md §2) by the model with trainable LoRA pairs, with the
// log-loss of chosen next tokens. backward() gives the loss's gradient for every LoRA A and B, flowing
// through every message's layers, including into the keys and values of parents that later messages
// attend to. Built from runtime/train/ops.h; instantiated for float (training) and double (the tests'
// finite-difference reference).

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "runtime/model/llama.h"
#include "runtime/model/lora.h"
#include "runtime/train/ops.h"

namespace choreo::train {

/// The weights LoRA adapts in each layer, in model::LoraTarget order (Q..Down); Output is apart.
inline constexpr int kLayerTargets = 7;

/// A model's frozen weights as float, dequantised once, in the shapes the forward pass reads.
struct FrozenModel {
  model::LlamaConfig config;
  kernels::RopeParams rope;          // freq_factors: see rope_params()
  std::vector<float> rope_factors;   // Llama-3 scaling, or empty
  std::vector<float> token_embd;  // n_vocab rows of dim
  std::vector<float> output;      // n_vocab rows of dim (the embeddings when tied)
  std::vector<float> output_norm;
  struct Layer {
    std::vector<float> attn_norm, ffn_norm;
    std::array<std::vector<float>, kLayerTargets> w;  // n_out rows of n_in each
  };
  std::vector<Layer> layers;

  static FrozenModel dequantise(const model::Model& m);
  /// The RoPE parameters, pointing at this object's factors.
  kernels::RopeParams rope_params() const {
    kernels::RopeParams p = rope;
    p.freq_factors = rope_factors.empty() ? nullptr : rope_factors.data();
    return p;
  }
  /// (n_in, n_out) of a target's weight.
  std::pair<int, int> shape(model::LoraTarget t) const;
};

/// Trainable LoRA pairs of one rank over chosen targets: for each, A (rank rows of n_in) and B (n_out rows of
/// rank), applied as y += alpha / rank * (x A^T) B^T.
template <class T>
struct LoraParams {
  int rank = 0;
  float alpha = 0;
  struct Pair {
    int n_in = 0, n_out = 0;
    std::vector<T> a, b;
  };
  std::vector<std::array<std::optional<Pair>, kLayerTargets>> layers;
  std::optional<Pair> output;

  float scale() const { return rank > 0 ? alpha / float(rank) : 0.0f; }
  /// Pairs for `targets` in layers [first_layer, end_layer) (end_layer -1: to the last; Output: the output
  /// projection), A random (uniform in [-1/sqrt(n_in), 1/sqrt(n_in)], seeded) and B zero, as LoRA starts.
  static LoraParams init(const FrozenModel& m, const std::vector<model::LoraTarget>& targets, int rank,
                         float alpha, uint64_t seed, int first_layer = 0, int end_layer = -1);
  /// The lowest layer with a pair (the layer count when only the output projection has one): back-propagation
  /// stops there, since nothing below it is trained.
  int lowest_layer() const;
  /// The same pairs with every value zero (gradient accumulators).
  LoraParams zeros_like() const;
  /// Every value of every pair, A then B, layer by layer (Output last): for optimisers and tests.
  std::vector<T*> values();
  size_t size() const;
};

/// One message of the graph, in order (parents before the messages that read them).
struct GraphMessage {
  std::vector<int32_t> tokens;
  int start_pos = 0;
  struct Parent {
    int message = 0;   // an earlier message of the graph
    int offset = 0;    // logical position of its first token
    int n_tokens = -1; // its first n tokens (-1: all)
  };
  std::vector<Parent> parents;
  /// Per token: the token whose log-loss the logits after it count (-1: none).
  std::vector<int32_t> targets;
  bool lora = true;  // encoded with the trainable pairs (false: the base model)
};

template <class T>
class Graph {
 public:
  Graph(const FrozenModel& model, const LoraParams<T>& lora) : model_(model), lora_(lora) {}
  /// Adds a message; returns its index.
  int add(GraphMessage m);
  /// Runs every message; returns the summed log-loss of every target.
  double forward();
  /// The gradients of forward()'s loss, added to `grads` (from zeros_like()).
  void backward(LoraParams<T>& grads);
  int n_targets() const;
  /// Activation recomputation: keep only each layer's input, k and v, and compute the rest again in
  /// backward() (one more forward pass of every layer; the same bits). Set before forward().
  void set_recompute(bool on) { recompute_ = on; }
  /// The bytes of activations forward() keeps for `tokens` tokens with LoRA pairs of `rank`.
  static size_t activation_bytes(const FrozenModel& model, int rank, size_t tokens, bool recompute);

 private:
  struct LayerActs {
    std::vector<T> x_in, xn, q, k, v, att, lse, x_mid, xn2, g, u, h;
    std::array<std::vector<T>, kLayerTargets> xa;  // x A^T of each adapted target
    std::vector<T> dk, dv;  // gradients of k (as stored: rotated) and v, from every reader
    void drop_intermediates();  // all but x_in, k, v, dk, dv
  };
  struct Acts {
    std::vector<LayerActs> layers;
    std::vector<T> x_final;
    std::vector<T> dxn_final;  // the loss's gradient at the output norm's output (rows of dim)
    std::vector<int32_t> positions;
  };
  std::vector<Segment<T>> segments(size_t i, int layer) const;
  /// Layer l of message i from its input x (updated to the layer's output), filling a's activations.
  void layer_forward(size_t i, int l, LayerActs& a, std::vector<T>& x) const;

  const FrozenModel& model_;
  const LoraParams<T>& lora_;
  std::vector<GraphMessage> messages_;
  std::vector<Acts> acts_;
  bool recompute_ = false;
};

}  // namespace choreo::train
