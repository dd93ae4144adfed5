#pragma once
// Plain requests of `choreo serve` (no choreo extensions): a chat or completion prompt as one token sequence,
// evaluated over the longest prefix the session cache holds (runtime/serve/session_cache.h), then decoded with
// continuous batching: every step, each choice of every request in flight draws one token, and all of them are
// evaluated in one forward pass (Session::decode_together). A request arriving mid-generation joins at the next
// step. Each choice's logits are those of a lone `choreo generate` run of the same prompt (batch-invariant
// kernels), so with the same seed its text is the same, bit for bit, whatever else the server is doing.

#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "runtime/model/sampler.h"
#include "runtime/serve/generation.h"
#include "runtime/serve/request.h"
#include "runtime/serve/session_cache.h"
#include "runtime/serve/text_stream.h"

namespace choreo::serve {

/// What a plain generation asks for.
struct PlainRequest : GenerationSettings {
  std::vector<model::Token> prompt;  // BOS included when the model adds one
  int n = 1;                         // choices; choice i samples with seed + i
  std::chrono::seconds keep_for{0};  // keep the sessions this long before dropping them for room
};

/// One plain generation in flight: filled by the engine thread, read by the request's thread.
class PlainGeneration : public Generation {
 public:
  explicit PlainGeneration(PlainRequest request) : request_(std::move(request)) {}
  const PlainRequest& request() const { return request_; }

 private:
  PlainRequest request_;
};

/// What the plain decoder did so far (GET /metrics).
struct PlainStats {
  uint64_t steps = 0;
  uint64_t step_rows = 0;       // choices decoded, over all steps
  uint64_t prompt_computed = 0;
  uint64_t prompt_reused = 0;
  uint64_t generated = 0;
};

/// Runs plain generations on the engine thread.
class PlainDecoder {
 public:
  PlainDecoder(const runtime::ModelSet& models, kv::PagePool& pool) : models_(models), cache_(models, pool) {}
  /// Evaluates the prompt and draws each choice's first token; what goes wrong ends `g` with the error.
  void admit(const std::shared_ptr<PlainGeneration>& g);
  /// One token for every choice in flight.
  void step();
  bool active() const { return !choices_.empty(); }
  const SessionCache& cache() const { return cache_; }
  /// Drops idle sessions, least recently used first, until `bytes` more fit in T0 (SessionCache::make_room).
  void make_room(size_t bytes) { cache_.make_room(bytes); }
  const PlainStats& stats() const { return stats_; }

 private:
  struct Open;
  struct Decoding {
    std::shared_ptr<Open> open;
    size_t index = 0;
    size_t slot = 0;
    model::Sampler sampler;
    TextStream text;
    model::Token pending = 0;
    int n_generated = 0;
  };
  std::vector<float> masked_;  // a row's logits without end-of-generation tokens (ignore_eos)
  /// Draws the choice's next token from `logits`; true when it goes on (its token is to be evaluated).
  bool advance(Decoding& c, std::span<const float> logits);
  void end(Decoding& c, const std::string& reason);
  /// A step failed before decoding the choices not `processed`: their generations end with `error`.
  void fail(const std::vector<bool>& processed, const std::vector<bool>& goes_on, const std::exception_ptr& error);

  const runtime::ModelSet& models_;
  SessionCache cache_;
  std::vector<Decoding> choices_;
  PlainStats stats_;
};

}  // namespace choreo::serve
