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
#include "runtime/engine/tiers.h"
#include "runtime/kv/message_store.h"
#include "runtime/model/llama.h"
#include "runtime/model/sampler.h"

namespace choreo::store {
class DiskStore;
class RedisStore;
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

  /// Adds a store below T1 (not owned): T2 or T3, with what the tiers do with it (runtime/engine/tiers.h).
  void add_store(store::EntryStore& store, StoreUse use) { tiers_.add_store(store, use); }
  /// Shorthand for add_store: a persistent store on disk (null: none) that takes evictions (within the T2
  /// budget), persist() and, with `persist_prefills`, every computed prefill. A prefill whose content key is
  /// not in memory is loaded from it when present.
  void set_disk_store(store::DiskStore* disk, bool persist_prefills = false);
  /// Shorthand for add_store: a Redis server as T3 (null: none). Every prefill this engine computes is
  /// written through to it, and a prefill or evicted message found in no faster tier is read from it
  /// (docs/store.md, "Tiers"). Encodings are shared with every process using the same server.
  void set_remote_store(store::RedisStore* remote);
  /// Saves a complete message's encoding to the persist store, with its ancestors that are not there yet
  /// (TierManager::persist). Throws InputError for an unknown or incomplete message, a released ancestor, or
  /// when no store persists.
  void persist(kv::MessageId id, uint64_t tag = 0) { tiers_.persist(id, tag); }
  /// The message with this content key: in memory, else loaded from a store (parents first, by key), else
  /// nullopt. `model`: whose entries to read (keys cover the model, so another model's never match).
  std::optional<kv::MessageId> load(uint64_t key, int model = 0);

  kv::MessageStore& store() { return store_; }
  const kv::MessageStore& store() const { return store_; }
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
  /// A repair policy for every call (choreo mode; docs/profile.md, "Repairing reused KV"), overriding the
  /// calls' own (PrefillRequest::repair, DecodeRequest::repair); nullopt: each call's own, none when unset.
  /// A call repairs the parents it reads away from their exact prefix position, in its own copy of their
  /// pages: the cached messages stay as they are.
  void set_repair(std::optional<RepairPolicy> policy) { repair_ = policy; }
  const std::optional<RepairPolicy>& repair() const { return repair_; }
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
  /// The KV tiers (runtime/engine/tiers.h): the T1 budget, the eviction policy, the T2 budget, prefetch and
  /// write-through. When a call needs pages the pool has no room for, messages no running call uses leave T0
  /// in policy order. Results never depend on the settings.
  void set_tiers(const kv::TierSettings& settings) { tiers_.set_settings(settings); }
  const kv::TierSettings& tier_settings() const { return tiers_.settings(); }
  TierManager& tier_manager() { return tiers_; }
  /// What the tiers did so far, with the peak bytes held per tier.
  kv::TierStats tier_stats() const { return tiers_.stats(); }
  /// Brings a message's encoding back to T0 ahead of a call that will read it. A message already resident,
  /// or one with nothing encoded, is left as it is. Throws InputError for an unknown id, or when T0 cannot
  /// hold it beside what running calls use.
  void prefetch(kv::MessageId id);
  /// True when a parent of the call is still being prefetched (its load into T0 has not finished): a
  /// scheduler may run other calls first (status-aware scheduling). Running it anyway waits for the load.
  bool loading(const PrefillRequest& request) const;
  bool loading(const DecodeRequest& request) const;
  /// Every move between tiers and every recomputation so far, in order of completion (for `--trace`; the
  /// first 2^20 are kept).
  const std::vector<kv::TierEvent>& tier_events() const { return tiers_.events(); }
  /// Bytes held in T1 now.
  size_t host_bytes_in_use() const { return tiers_.host_bytes_in_use(); }
  /// How soon each cached message is read next, as the workflow instances running here see it (KVFlow;
  /// the KV tiers' eviction and prefetch read it). Instances register and remove themselves.
  StepOracleRegistry& step_oracles() { return tiers_.step_oracles(); }

 private:
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
  // Encodes a message again over its parents, the same bits (the tier manager's Recompute).
  void recompute(kv::Message& m, CallStats* stats);
  bool parent_loading(const std::vector<Parent>& parents, int model) const;  // for a call on `model`
  // ---- repair of parents read out of their exact prefix position (runtime/engine/repair.cc) ----
  struct RepairRow;
  // The policy a call that asks for `requested` runs with (set_repair first; none outside choreo mode).
  RepairPolicy repair_policy(const std::optional<RepairPolicy>& requested) const;
  // Per view of a call on `model`: whether its cached encoding differs from what the call's own context would
  // give (it is not in its exact prefix position: a parent's encoding is exact only when it was made over
  // exactly the views before it, at their offsets, each exact itself, by this model, and placed where it was
  // encoded).
  std::vector<bool> inexact_views(std::span<const PlacedView> views, int model) const;
  // One call's repair: its work, its policy, and where to count and report what was recomputed (either may be
  // null).
  struct RepairJob {
    Work* work = nullptr;
    RepairPolicy policy;
    CallStats* stats = nullptr;
    std::vector<RepairedParent>* report = nullptr;
  };
  struct RepairState;
  // Gives each job's work its own repaired copies of its inexact views (Work::repaired) as its policy says,
  // and marks its message with the policy. Nothing for a job whose views are all exact or whose policy is
  // none. first:K's rows are left pending on the work (Work::pending_repair) to ride in the call's own first
  // forward pass (take_pending_repairs); a pass of their own (repair_pass) runs only when that pass cannot take
  // them. Jobs of one model and one policy run their recomputation in the same forward passes; each job's
  // choice (select:R's ranking) is its own, so a call's bits are the same alone or with others.
  void apply_repairs(std::span<const RepairJob> jobs);
  void apply_repair(Work& w, const RepairPolicy& policy, CallStats* stats, std::vector<RepairedParent>* report) {
    const RepairJob job{&w, policy, stats, report};
    apply_repairs(std::span<const RepairJob>(&job, 1));
  }
  // apply_repairs' steps. A job's work gets a copy of the pages holding the tokens its policy recomputes, and
  // `st` every token of the views it repairs (false: nothing to repair).
  bool prepare_repair(const RepairJob& job, size_t j, RepairState& st);
  // select:R for one group (`members`: the jobs of one model and one policy): layers 0 and 1 for every token,
  // then passes over each job's set, narrowed by its own ranking, up to the last layer.
  void select_repairs(std::span<const RepairJob> jobs, const std::vector<size_t>& members, int model,
                      double r, std::vector<RepairState>& state);
  // Keeps the `keep` rows of `st` whose K/V at `layer` deviate most (ties: the earlier token), in token order.
  void narrow_repair(const Work& w, RepairState& st, int layer, size_t keep, size_t dim) const;
  // What the job recomputed, counted in its stats and listed in its report.
  void account_repair(const RepairJob& job, const RepairState& st) const;
  // Runs layers [first_layer, end_layer) of the jobs' model for `rows` (sorted by job, view, then token): each
  // recomputes its token's K/V in its view's copy, attending to the BOS, the views before its own and its own
  // view's earlier tokens. `x_in`: each row's hidden state at the input of first_layer (dim floats a row), or
  // null; `captured`, when given, receives each row's hidden state at the input of end_layer.
  void repair_pass(std::span<const RepairJob> jobs, std::span<const RepairRow> rows, int first_layer,
                   int end_layer, const float* x_in, std::vector<float>* captured);
  // Appends `rows` to batch_ as repair_pass runs them: their tokens, positions, K/V slots and one attention
  // group per run of consecutive tokens of one view, on the model (and adapters) of the row's work.
  void add_repair_rows(std::span<const RepairJob> jobs, std::span<const RepairRow> rows);
  // The pending first:K rows of `work` (Work::pending_repair), taken from them, as jobs and rows for
  // add_repair_rows.
  static std::pair<std::vector<RepairJob>, std::vector<RepairRow>> take_pending_repairs(std::span<Work*> work);
  // Per row (all of one job's work `w`): the squared distance between its token's K and V at `layer` in its
  // view's copy and in the cached parent (float64).
  std::vector<double> repair_deviation(const Work& w, std::span<const RepairRow> rows, int layer) const;
  // The E-cache layers a new message of `model` saves, for the plans to the models that will read it.
  std::vector<int> e_layers_for(int model, const std::optional<std::vector<int>>& read_by) const;

  ModelSet models_;
  // Before store_: messages' host copies are charged to its T1, and it stops its loads before they go.
  TierManager tiers_;
  kv::MessageStore store_;
  Mode mode_;
  int max_batch_;
  int n_ctx_;
  std::vector<kv::MessageId> bos_;  // per model: the implicit BOS it encoded (kNoMessage: none)
  // (message, model) -> that model's encoding of another model's message (encoding_on).
  std::map<std::pair<kv::MessageId, int>, kv::MessageId> encodings_on_;
  std::unique_ptr<CallMode> call_mode_;  // what mode_ does differently (runtime/engine/mode.h)
  Repositioning repositioning_ = Repositioning::QueryRotation;
  std::optional<RepairPolicy> repair_;  // set_repair
  bool device_sampling_ = false;  // set from the backend by the constructor
  model::Batch batch_;
  model::RunState state_;
  std::vector<float> logits_;
  std::vector<int32_t> top_ids_;  // candidates' tokens of a pass with model::Batch::top_k
  std::vector<float> x_in_, captured_;  // a pass's input hidden states and captured ones (LayerPass)
  uint64_t last_prefix_scope_ = 0;
  // Key re-rotation path: temporary pages holding re-rotated copies of parents.
  std::vector<std::unique_ptr<kv::PageList>> rerotated_;
};

}  // namespace choreo::runtime
