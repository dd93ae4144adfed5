#pragma once
// The Prompt Choreography engine (DESIGN.md §2): prefill and decode calls over the global message cache.
// Every call attends to its parents (placed at chosen offsets), to the implicit BOS, and to its own earlier
// tokens; nothing else. Independent calls given together run as one batched forward pass per step.

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/engine/model_set.h"
#include "runtime/engine/placement.h"
#include "runtime/engine/requests.h"
#include "runtime/engine/step_oracle.h"
#include "runtime/kv/message_store.h"
#include "runtime/model/llama.h"
#include "runtime/model/sampler.h"

namespace choreo::store {
class DiskStore;
class RedisStore;
struct EntryMeta;
}

namespace choreo::runtime {

class CallMode;

/// Which execution path the engine takes for its calls (each one's own part is in runtime/engine/mode_*.cc).
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

/// Runs calls on one or several models (runtime/engine/model_set.h) over one message store.
class Engine {
 public:
  /// Calls choose one of `models` (the models' weights must outlive the engine); the pool's layout must be
  /// the base model's. Each model's KV is its own: content keys and store entries carry its fingerprint,
  /// and a call that names a parent encoded by another model attends to its own model's encoding of it
  /// (computed first when there is none: the `recompute` cross-model plan, counted in n_cross_model).
  Engine(ModelSet models, kv::PagePool& pool, Mode mode = Mode::Choreo, int max_batch = 512);
  /// One model: `model`, with the adapters of `lora` when given.
  Engine(const model::Model& model, kv::PagePool& pool, Mode mode = Mode::Choreo, int max_batch = 512,
         const model::LoraStack* lora = nullptr);
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
  /// Uses a Redis server as T3 (not owned; null: none): every prefill this engine computes is written through
  /// to it, and a prefill or evicted message found in no other tier is read from it (docs/store.md, "Tiers").
  /// Encodings are shared with every process using the same server.
  void set_remote_store(store::RedisStore* remote);
  /// Saves a complete message's encoding to the disk store, with its ancestors that are not there yet (so it
  /// can be loaded by key alone), parents before children, each message once. If entries it wrote vanish
  /// meanwhile (another process deleting them), they are written again, at most 3 times in all; then
  /// RuntimeFailure.
  /// `tag` is stored as-is (e.g. a PML schema hash). Throws InputError for an unknown or incomplete message,
  /// a released ancestor, or when no disk store is set.
  void persist(kv::MessageId id, uint64_t tag = 0);
  /// The message with this content key: in memory, else loaded from the disk store (parents first, by key),
  /// else nullopt. `model`: whose entries to read (keys cover the model, so another model's never match).
  std::optional<kv::MessageId> load(uint64_t key, int model = 0);

  kv::MessageStore& store() { return store_; }
  /// The default model's weights (models()[0]).
  const model::Model& model() const { return *models_.base().weights; }
  const ModelSet& models() const { return models_; }
  /// Changes how `receiver` reads what `sender` encoded (ModelSet::set_plan). Encodings made for `receiver`
  /// under the previous plan are released; later calls make them again as the new plan says.
  void set_plan(int sender, int receiver, CrossModelPlan plan);
  /// What the KV of the default model depends on: its file, and the adapters and scales it runs with.
  uint64_t weights_fingerprint() const { return models_.base().fingerprint; }
  Mode mode() const { return mode_; }
  /// The first of `n` prefix scopes no call has used yet (DecodeRequest::prefix_scope).
  uint64_t new_prefix_scopes(uint64_t n = 1) {
    const uint64_t first = last_prefix_scope_ + 1;
    last_prefix_scope_ += n;
    return first;
  }
  void set_repositioning(Repositioning r) { repositioning_ = r; }
  /// Whether decodes that sample with top_k, or greedily, and record neither logits nor logprobs take only
  /// their candidates from the backend (kernels::Backend::top_k, model::Sampler::sample_candidates): the same
  /// tokens, fewer bytes downloaded. Default: what the base model's backend prefers
  /// (Backend::prefers_device_sampling: device backends yes, the CPU backend no).
  void set_device_sampling(bool on) { device_sampling_ = on; }
  bool device_sampling() const { return device_sampling_; }
  /// Position of the first parent token: 1 after the implicit BOS, 0 for models without BOS.
  int first_pos() const { return bos_.front() == kv::kNoMessage ? 0 : 1; }
  /// The implicit BOS `model` encoded, which every call on it attends to at position 0 (kNoMessage: none).
  kv::MessageId bos(int model) const { return bos_[size_t(model)]; }
  /// The KV tiers below T0 (the page pool's budget): the T1 budget and the eviction policy
  /// (runtime/kv/tiers.h, docs/store.md "Tiers"). When a call needs pages the pool has no room for, messages
  /// no running call uses leave T0 in policy order: to T1 when it has room, else nowhere (recomputed from
  /// their parents if needed again, with the same bits). Results never depend on the settings.
  void set_tiers(const kv::TierSettings& settings);
  const kv::TierSettings& tiers() const { return tiers_; }
  /// What the tiers did so far, with the peak bytes held per tier.
  kv::TierStats tier_stats() const;
  /// Brings a message's encoding back to T0 (from T1, else recomputed over its parents) ahead of a call
  /// that will read it. A message already resident, or one with nothing encoded, is left as it is.
  /// Throws InputError for an unknown id, or when T0 cannot hold it beside what running calls use.
  void prefetch(kv::MessageId id);
  /// True when a parent of the call is still being prefetched (its load into T0 has not finished): a
  /// scheduler may run other calls first (status-aware scheduling). Running it anyway waits for the load.
  bool loading(const PrefillRequest& request) const;
  bool loading(const DecodeRequest& request) const;
  /// Every move between tiers and every recomputation so far, in order of completion (for `--trace`; the
  /// first 2^20 are kept).
  const std::vector<kv::TierEvent>& tier_events() const { return tier_events_; }
  /// Bytes held in T1 now.
  size_t host_bytes_in_use() const { return host_.bytes_in_use(); }
  /// Bytes written to T2 by eviction so far (bounded by TierSettings::disk_bytes).
  size_t disk_bytes_written() const { return tier_stats_.t2_write_bytes; }

  /// How soon each cached message is read next, as the workflow instances running here see it (KVFlow;
  /// the KV tiers' eviction and prefetch read it). Instances register and remove themselves.
  StepOracleRegistry& step_oracles() { return step_oracles_; }

 private:
  StepOracleRegistry step_oracles_;
  struct Work;
  void encode(std::span<Work*> work);
  // How many tokens a decode generates at most: its forced tokens', else exact_tokens, else max_tokens.
  static int token_budget(const DecodeRequest& r);
  // Samples and feeds one token per unfinished call per step until every call is finished.
  void generate(std::span<const DecodeRequest> requests, std::vector<Work>& works,
                std::vector<DecodeResult>& results, double t0);
  // Which layers a pass runs, and where it captures hidden states (model::Batch).
  struct LayerPass {
    int first = 0;
    int end = -1;      // -1: to the last
    std::vector<int> capture;  // the layers (ascending) whose input each work's `captured` receives
  };
  // Encodes works that all run on `weights` (one forward pass per step).
  void encode_on(const model::Model& weights, std::span<Work*> work, LayerPass pass);
  // The parents' segments of a work, behind the implicit BOS of `bos_model` (-1: the work's own model).
  std::vector<kernels::KvSegment> segments_for(Work& w, int bos_model = -1);
  bool is_bos(kv::MessageId id) const;
  // Two of the models have the same weights and adapters: their encodings are interchangeable.
  bool same_model(int a, int b) const { return models_[size_t(a)].fingerprint == models_[size_t(b)].fingerprint; }
  void check_model(int model, std::string_view call, size_t index) const;
  // ---- several models (runtime/engine/cross_model.cc) ----
  // The parents a call on `model` attends to: each one encoded by another model replaced by `model`'s own
  // encoding of it (found, loaded or computed now, with its ancestors; counted in stats.n_cross_model).
  std::vector<Parent> parents_on(int model, std::span<const Parent> parents, CallStats& stats);
  // `model`'s encoding of message `id` (id itself when `model` encoded it, or reads its KV as it is).
  kv::MessageId encoding_on(int model, kv::MessageId id, CallStats& stats);
  // A `partial` plan's encoding of `src` for `model`: src's KV copied, then layers [begin, end) recomputed by
  // `model` from src's E cache (computed first, by src's model, when src has none).
  void encode_partial(kv::Message& m, const kv::Message& src, const CrossModelPlan& plan,
                      const std::vector<PlacedView>& views, CallStats& stats);
  // ---- tiers ----
  class Held;
  // Brings message `id` back to T0 if it was evicted (from T1, else by recomputing it over its parents),
  // and marks it in use until `held` ends. Loads are counted in `stats` when given.
  void hold(kv::MessageId id, Held& held, CallStats* stats);
  void make_resident(kv::Message& m, CallStats* stats);
  // Holds each of m's recorded parents in T0 (brought back first if evicted) until `held` ends, and returns
  // them as views at their recorded offsets.
  std::vector<PlacedView> hold_parents(const kv::Message& m, Held& held, CallStats* stats);
  void recompute(kv::Message& m, CallStats* stats);
  bool load_pages_stored(kv::Message& m);  // T2 or T3 -> T0; false: no usable entry
  // ---- prefetch (TierSettings::prefetch_steps) ----
  struct Loading;
  bool parent_loading(const std::vector<Parent>& parents, int model) const;  // for a call on `model`
  void prefetch_due();  // starts prefetches for the messages due within prefetch_steps
  bool start_prefetch(kv::Message& m, size_t steps);
  // Frees T0 pages for n_pages by evicting only messages read later than `steps` (or never); false if not.
  bool make_room_for(size_t n_pages, size_t steps);
  // Waits for m's prefetch and applies it; false when it failed (m is then out of T0 again).
  bool settle(kv::Message& m, CallStats* stats);
  void settle_finished();  // settles every prefetch that has finished
  bool settle_one();       // waits for the oldest prefetch in flight; false when none is
  bool evict_one();                    // the page pool's reclaimer
  // What the eviction order knows of a message; nullopt when a running workflow pins it.
  std::optional<kv::EvictionCandidate> candidate(kv::MessageId id, const kv::Message& m) const;
  // The resident messages T0 could evict now, in the policy's order (the first goes first). The ones that
  // must stay (in use, pinned) are counted in `held` when given, for the error of a pool that cannot fit.
  struct HeldPages {
    size_t pages = 0;
    std::vector<std::string> messages;  // the first few, described
  };
  std::vector<kv::EvictionCandidate> eviction_order(HeldPages* held);
  void offload(kv::Message& m);        // frees m's T0 pages, first copying them to T1 when there is room
  // Charges m's E cache to the tier of m's fastest copy of KV (T0, else T1), or drops it when that tier has
  // no room or m is in neither; called whenever m is encoded or moves between tiers.
  void place_e_cache(kv::Message& m);
  // The E-cache layers a new message of `model` saves, for the plans to the models that will read it.
  std::vector<int> e_layers_for(int model, const std::optional<std::vector<int>>& read_by) const;
  bool make_host_room(size_t bytes, kv::MessageId keep);
  // T1 can take `bytes` now, after dropping other copies (never `keep`'s) if need be.
  bool host_room(size_t bytes, kv::MessageId keep) {
    return bytes <= host_.budget_bytes() && (host_.fits(bytes) || make_host_room(bytes, keep));
  }
  // The message whose reads m's are: another model's encoding of a message is read when that message is.
  static kv::MessageId read_as(const kv::Message& m) { return m.source != kv::kNoMessage ? m.source : m.id; }
  bool may_write_back(const kv::Message& m, size_t bytes) const;
  // To T2, when it has room; recorded as `kind` (Offload: on eviction, Write: write-through).
  void write_back(kv::Message& m, std::vector<const std::byte*> pages,
                  kv::TierEvent::Kind kind = kv::TierEvent::Kind::Offload);
  // A tier event of m that started at start_ms and ends now (tier_events()).
  void record(kv::TierEvent::Kind kind, int tier, const kv::Message& m, uint64_t bytes, double start_ms);
  void write_through(kv::Message& m);  // TierSettings::write_through: to T2 as soon as it is complete
  void write_resident(kv::Message& m, kv::TierEvent::Kind kind);  // its T0 pages to T2, when it has room
  // The persistent store: see persist() and load().
  // `id` and its ancestors the disk store has no usable entry for, parents first.
  std::vector<kv::MessageId> unstored_ancestry(kv::MessageId id);
  // false: the entry's name is unusable. `pages`: where its pages are (default: T0, loaded first if evicted).
  bool save_entry(kv::MessageId id, uint64_t tag, std::vector<const std::byte*> pages = {});
  // Loads parents first (recursively). Parents that load are in memory for the next lookup, and a load stops
  // at its first parent that fails, so the work stays linear in the ancestry even where paths meet.
  std::optional<kv::MessageId> load_stored(uint64_t key, int depth, int model);
  // A stored entry whose header passed its checks: a mapped T2 file, or a T3 value read from Redis.
  struct Stored;
  std::optional<Stored> open_stored(uint64_t key, int model);  // T2 first, then T3
  // Reads s's pages into m's (checking every page and E-cache section first) and, when m saves E caches
  // and holds none, the ones of its layers that s carries.
  bool read_stored(const Stored& s, kv::Message& m);
  // m's E caches at `layers` from its T2 or T3 entry (those it holds, each checked), or none; for a plan
  // whose sender's E cache was dropped from memory but not from the store.
  std::map<int, std::vector<float>> stored_e_cache(const kv::Message& m, std::span<const int> layers);
  // Takes E caches read from a T2 or T3 entry into m (when m holds none and they are its model's), counting
  // them as loaded from `tier`.
  void take_e_cache(kv::Message& m, std::map<int, std::vector<float>> e_cache, int tier);
  // Drops the E caches not of m's shape from e_cache and counts the rest as loaded from `tier`; false when
  // none is left.
  bool accept_e_cache(const kv::Message& m, std::map<int, std::vector<float>>& e_cache, int tier);
  void report_stored(const Stored& s, uint64_t key, std::string_view what);
  store::EntryMeta entry_meta(const kv::Message& m, uint64_t tag) const;
  void share(kv::Message& m);  // T3 write-through

  ModelSet models_;
  kv::HostTier host_;  // before store_: messages' host copies are charged to it
  kv::MessageStore store_;
  kv::TierSettings tiers_;
  kv::TierStats tier_stats_;
  std::vector<kv::TierEvent> tier_events_;
  Mode mode_;
  int max_batch_;
  int n_ctx_;
  std::vector<kv::MessageId> bos_;  // per model: the implicit BOS it encoded (kNoMessage: none)
  // (message, model) -> that model's encoding of another model's message (encoding_on).
  std::map<std::pair<kv::MessageId, int>, kv::MessageId> encodings_on_;
  std::unique_ptr<CallMode> call_mode_;  // what mode_ does differently (runtime/engine/mode.h)
  Repositioning repositioning_ = Repositioning::QueryRotation;
  bool device_sampling_ = false;  // set from the backend by the constructor
  store::DiskStore* disk_ = nullptr;
  store::RedisStore* remote_ = nullptr;
  bool persist_prefills_ = false;
  model::Batch batch_;
  model::RunState state_;
  std::vector<float> logits_;
  std::vector<int32_t> top_ids_;  // candidates' tokens of a pass with model::Batch::top_k
  std::vector<float> x_in_, captured_;  // a pass's input hidden states and captured ones (LayerPass)
  uint64_t last_prefix_scope_ = 0;
  // Key re-rotation path: temporary pages holding re-rotated copies of parents.
  std::vector<std::unique_ptr<kv::PageList>> rerotated_;
  // Prefetches in flight, in the order they started. Declared last: destroyed first, each waiting for its
  // background work, while the pages it writes still exist.
  std::vector<std::pair<kv::MessageId, std::unique_ptr<Loading>>> loading_;
};

}  // namespace choreo::runtime
