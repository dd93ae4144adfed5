#pragma once
// The calls the engine takes and what it answers (runtime/engine/engine.h runs them).

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/repair_policy.h"
#include "runtime/engine/placement.h"
#include "runtime/kv/message_store.h"
#include "runtime/model/sampler.h"
#include "runtime/model/vocab.h"

namespace choreo::runtime {

/// Time and work accounting of one call.
struct CallStats {
  int start_pos = 0;   // where the new message starts
  int n_computed = 0;  // tokens run through the model for this call
  int n_reused = 0;    // cached tokens attended to without recomputation
  // KV tiers (runtime/kv/tiers.h): what it took to bring evicted parents back to T0 before the call ran.
  int n_loaded = 0;       // tokens loaded back from T1 (host memory) or T2 (disk)
  int n_recomputed = 0;   // tokens recomputed because no tier held them (not counted in n_computed)
  // Tokens loaded back, by the tier they came from (index 1: T1, 2: T2, 3: T3): n_loaded's, and a prefill's
  // own tokens when its encoding was loaded from a store by content key (PrefillResult::loaded), which
  // n_loaded leaves out (they are in n_reused).
  std::array<int, 4> n_loaded_from{};
  // Tokens of parents (and their ancestors) encoded by another model that this call's model encoded for
  // itself first, whole (`recompute` plan) or some layers (`partial`). Not in n_computed or n_recomputed;
  // the parents' tokens are in n_reused as every parent's are (the call itself attends to them).
  int n_cross_model = 0;
  // Of those, tokens read through a `partial` plan whose sender had no E cache: the sender's first layers
  // ran again to recompute it.
  int n_e_recomputed = 0;
  // Tokens of cached parents this call recomputed in its own context (its repair policy, RepairPolicy), in
  // whole-token equivalents: the token-layers recomputed over the model's layers, rounded up. Counted in
  // n_computed and taken out of n_reused.
  int n_repaired = 0;
  double load_ms = 0;     // time spent on both
  double ttft_ms = 0;  // call start to first generated token (decode), or to encoded (prefill)
  double total_ms = 0;
};

/// What a call's repair policy recomputed of one parent it read out of its exact prefix position.
struct RepairedParent {
  kv::MessageId message = kv::kNoMessage;
  /// Per visible token of the parent: its K/V was recomputed in the call's context at layers [0, n) (0: read
  /// as cached). first:K gives every layer to the first K tokens; select:R gives layers 0 and 1 to every
  /// token, then fewer tokens each layer (runtime/engine/repair.cc).
  std::vector<int> layers;
};

/// A prefill call: encode `tokens` over `parents` (Engine::prefill).
struct PrefillRequest {
  std::vector<model::Token> tokens;
  std::vector<Parent> parents;
  std::optional<int> new_offset;
  std::string agent;
  kv::Visibility visibility = kv::Visibility::Public;
  int model = 0;  // which of the engine's models encodes it (Engine::models())
  // The models whose calls will read the message, or anything encoded over it, as the compiled plan shows;
  // its E cache is saved for the `partial` plans to those of them that are other models. Unset: not known,
  // saved for every plan from `model`.
  std::optional<std::vector<int>> read_by;
  // How it repairs the parents it reads out of their exact prefix position (unset: none); Engine::set_repair
  // overrides it.
  std::optional<RepairPolicy> repair;
};

/// What a prefill produced: the message holding the encoding, and how it was obtained.
struct PrefillResult {
  kv::MessageId id = kv::kNoMessage;
  bool deduplicated = false;  // an identical encoding already existed; nothing was computed
  bool loaded = false;        // read from the persistent store (docs/store.md); nothing was computed
  CallStats stats;
  std::vector<RepairedParent> repaired;  // what its repair policy recomputed, per parent repaired
};

/// A decode call: encode `header` over `parents`, then generate (Engine::decode).
struct DecodeRequest {
  std::vector<model::Token> header;  // must be non-empty: the first token is sampled from its last token
  std::vector<Parent> parents;
  std::optional<int> new_offset;
  model::SamplingParams sampling;
  int max_tokens = 256;
  std::vector<std::string> stop;    // stop strings; the text ends before the first one
  int logprobs = 0;                 // top-k log-probabilities per generated token
  bool record_logits = false;       // keep every step's full logits (tests)
  std::optional<int> exact_tokens;  // generate exactly this many tokens, ignoring EOG/stop (profiling)
  // Teacher forcing: the tokens "generated" are these, in order, whatever the logits say (EOG and stop
  // strings ignored, as with exact_tokens; logits, logprobs and the message are as for sampled tokens).
  // Without record_logits and logprobs nothing is needed per step, so the forced tokens are encoded in one
  // pass, as a prefill is: the same message, its keys and values rounded as a prefill's (finetune's traces).
  std::vector<model::Token> forced;
  std::function<void(model::Token)> on_token;  // called with each generated token as it is drawn (streaming)
  // Asked after each token is drawn: true ends the call there (stop_reason "cancelled"), its message holding
  // what was generated so far; the other calls of its batch go on (choreo serve: the client is gone).
  std::function<bool()> cancelled;
  std::string agent;
  kv::Visibility visibility = kv::Visibility::Public;
  int model = 0;  // which of the engine's models runs it (Engine::models())
  std::optional<std::vector<int>> read_by;  // as PrefillRequest::read_by, for the decode's message
  // Mode::Prefix only: reuse prefixes of earlier sequences of the same scope (Engine::new_prefix_scope).
  // Workflow instances get a scope each, so an instance's result never depends on which instances ran
  // before it on the engine (a reused prefix is laid out differently from a recomputed one, and rounds
  // differently). 0, the default, is one scope shared by every call that leaves it.
  uint64_t prefix_scope = 0;
  std::optional<RepairPolicy> repair;  // as PrefillRequest::repair
};

/// The log-probability of one generated token and of the `logprobs` likeliest alternatives.
struct TokenLogprobs {
  model::Token token = 0;
  float logprob = 0;
  std::vector<std::pair<model::Token, float>> top;
};

/// What a decode produced: the message its result names, the generated tokens and text, and why it stopped.
struct DecodeResult {
  kv::MessageId id = kv::kNoMessage;
  std::vector<model::Token> generated;  // excludes the header; includes a final EOG token if one was drawn
  std::string text;                     // detokenised generated tokens, EOG excluded, cut at a stop string
  std::string stop_reason;              // "eog", "stop", "length", "cancelled"
  std::vector<TokenLogprobs> logprobs;
  std::vector<std::vector<float>> logits;  // with record_logits: logits that produced each generated token
  CallStats stats;
  std::vector<RepairedParent> repaired;  // what its repair policy recomputed, per parent repaired
};

}  // namespace choreo::runtime
