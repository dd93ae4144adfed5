#pragma once
// The Prompt Choreography engine (DESIGN.md §2): prefill and decode calls over the global message cache.
// Every call attends to its parents (placed at chosen offsets), to the implicit BOS, and to its own earlier
// tokens; nothing else. Independent calls given together run as one batched forward pass per step.

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/engine/placement.h"
#include "runtime/kv/message_store.h"
#include "runtime/model/llama.h"
#include "runtime/model/sampler.h"

namespace choreo::store {
class DiskStore;
}

namespace choreo::runtime {

/// Which execution path the engine takes for decode calls.
enum class Mode {
  Choreo,  // parents' cached encodings are reused at their placements
  Naive,   // each decode re-encodes BOS + its parents' tokens (in list order) + header, like a chat API call
  Prefix,  // Naive plus reuse of the longest token prefix encoded before (vLLM/SGLang-style prefix caching)
};
std::string_view mode_name(Mode m);
/// Parses "choreo", "naive", "prefix"; throws InputError otherwise.
Mode parse_mode(std::string_view name);

/// How attention reaches a parent placed away from where it was encoded.
enum class Repositioning {
  QueryRotation,  // rotate the query by -delta per segment (default; stored keys are never touched)
  KeyRerotation,  // copy the parent's KV with keys re-rotated by +delta (the paper's method; reference path)
};

/// Time and work accounting of one call.
struct CallStats {
  int start_pos = 0;    // where the new message starts
  int n_computed = 0;   // tokens run through the model for this call
  int n_reused = 0;     // cached tokens attended to without recomputation
  double ttft_ms = 0;   // call start to first generated token (decode), or to encoded (prefill)
  double total_ms = 0;
};

struct PrefillRequest {
  std::vector<model::Token> tokens;
  std::vector<Parent> parents;
  std::optional<int> new_offset;
  std::string agent;
  kv::Visibility visibility = kv::Visibility::Public;
};

struct PrefillResult {
  kv::MessageId id = kv::kNoMessage;
  bool deduplicated = false;  // an identical encoding already existed; nothing was computed
  bool loaded = false;        // read from the persistent store (docs/store.md); nothing was computed
  CallStats stats;
};

struct DecodeRequest {
  std::vector<model::Token> header;  // must be non-empty: the first token is sampled from its last token
  std::vector<Parent> parents;
  std::optional<int> new_offset;
  model::SamplingParams sampling;
  int max_tokens = 256;
  std::vector<std::string> stop;     // stop strings; the text ends before the first one
  int logprobs = 0;                  // top-k log-probabilities per generated token
  bool record_logits = false;        // keep every step's full logits (tests)
  std::optional<int> exact_tokens;   // generate exactly this many tokens, ignoring EOG/stop (profiling)
  std::function<void(model::Token)> on_token;  // called with each generated token as it is drawn (streaming)
  std::string agent;
  kv::Visibility visibility = kv::Visibility::Public;
  // Mode::Prefix only: reuse prefixes of earlier sequences of the same scope (Engine::new_prefix_scope).
  // Workflow instances get a scope each, so an instance's result never depends on which instances ran
  // before it on the engine (a reused prefix is laid out differently from a recomputed one, and rounds
  // differently). 0, the default, is one scope shared by every call that leaves it.
  uint64_t prefix_scope = 0;
};

struct TokenLogprobs {
  model::Token token = 0;
  float logprob = 0;
  std::vector<std::pair<model::Token, float>> top;
};

struct DecodeResult {
  kv::MessageId id = kv::kNoMessage;
  std::vector<model::Token> generated;  // excludes the header; includes a final EOG token if one was drawn
  std::string text;                     // detokenised generated tokens, EOG excluded, cut at a stop string
  std::string stop_reason;              // "eog", "stop", "length"
  std::vector<TokenLogprobs> logprobs;
  std::vector<std::vector<float>> logits;  // with record_logits: logits that produced each generated token
  CallStats stats;
};

/// Runs calls on one model over one message store.
class Engine {
 public:
  Engine(const model::Model& model, kv::PagePool& pool, Mode mode = Mode::Choreo, int max_batch = 512);
  ~Engine();

  PrefillResult prefill(const PrefillRequest& request);
  std::vector<PrefillResult> prefill_batch(std::span<const PrefillRequest> requests);
  DecodeResult decode(const DecodeRequest& request);
  std::vector<DecodeResult> decode_batch(std::span<const DecodeRequest> requests);

  /// Frees a message's KV pages. Later calls naming it fail with "unknown message"; messages encoded over it
  /// keep their own encodings (visibility is not transitive). The implicit BOS cannot be released.
  /// Throws InputError for an unknown id or the BOS.
  void release(kv::MessageId id);

  /// Uses a persistent store (not owned; null, the default, means none): a prefill whose content key is not
  /// in memory is loaded from it when present. With `persist_prefills`, every computed prefill is saved to it.
  void set_disk_store(store::DiskStore* disk, bool persist_prefills = false);
  /// Saves a complete message's encoding to the disk store, with its ancestors that are not there yet (so it
  /// can be loaded by key alone), parents before children, each message once. If entries it wrote vanish
  /// meanwhile (another process deleting them), they are written again, at most 3 times in all; then
  /// RuntimeFailure.
  /// `tag` is stored as-is (e.g. a PML schema hash). Throws InputError for an unknown or incomplete message,
  /// a released ancestor, or when no disk store is set.
  void persist(kv::MessageId id, uint64_t tag = 0);
  /// The message with this content key: in memory, else loaded from the disk store (parents first, by key),
  /// else nullopt.
  std::optional<kv::MessageId> load(uint64_t key);

  kv::MessageStore& store() { return store_; }
  const model::Model& model() const { return model_; }
  Mode mode() const { return mode_; }
  /// The first of `n` prefix scopes no call has used yet (DecodeRequest::prefix_scope).
  uint64_t new_prefix_scopes(uint64_t n = 1) {
    const uint64_t first = last_prefix_scope_ + 1;
    last_prefix_scope_ += n;
    return first;
  }
  void set_repositioning(Repositioning r) { repositioning_ = r; }
  /// Position of the first parent token: 1 after the implicit BOS, 0 for models without BOS.
  int first_pos() const { return bos_ == kv::kNoMessage ? 0 : 1; }

 private:
  struct Work;
  void encode(std::span<Work*> work);
  std::vector<kernels::KvSegment> segments_for(Work& w);
  kv::Message& new_message(const Placement& placement, int start, const std::string& agent,
                           kv::Visibility visibility);
  // The persistent store: see persist() and load().
  // `id` and its ancestors the disk store has no usable entry for, parents first.
  std::vector<kv::MessageId> unstored_ancestry(kv::MessageId id);
  bool save_entry(kv::MessageId id, uint64_t tag);              // false: the entry's name is unusable
  // Loads parents first (recursively). Parents that load are in memory for the next lookup, and a load stops
  // at its first parent that fails, so the work stays linear in the ancestry even where paths meet.
  std::optional<kv::MessageId> load_from_disk(uint64_t key, int depth);

  const model::Model& model_;
  kv::MessageStore store_;
  Mode mode_;
  int max_batch_;
  int n_ctx_;
  kv::MessageId bos_ = kv::kNoMessage;
  Repositioning repositioning_ = Repositioning::QueryRotation;
  store::DiskStore* disk_ = nullptr;
  bool persist_prefills_ = false;
  model::Batch batch_;
  model::RunState state_;
  std::vector<float> logits_;
  // Prefix mode: flat sequences encoded so far, as chains of (message, tokens) chunks.
  struct PrefixEntry {
    uint64_t scope = 0;
    std::vector<model::Token> tokens;
    std::vector<std::pair<kv::MessageId, int>> chunks;
  };
  std::vector<PrefixEntry> prefix_entries_;
  uint64_t last_prefix_scope_ = 0;
  // Key re-rotation path: temporary pages holding re-rotated copies of parents.
  std::vector<std::unique_ptr<kv::PageList>> rerotated_;
};

}  // namespace choreo::runtime
