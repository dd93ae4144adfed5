#pragma once
// The engine's private part shared by its source files (engine.cc, cross_model.cc, repair.cc): a message
// being encoded.

#include <map>
#include <memory>
#include <vector>

#include "runtime/engine/engine.h"

namespace choreo::runtime {

/// One message being encoded: its tokens [msg->n_encoded, tokens.size()) are pending.
struct Engine::Work {
  kv::Message* msg = nullptr;
  std::vector<PlacedView> views;  // parents, BOS excluded
  bool want_logits = false;       // logits of the last pending token
  std::vector<float> logits;
  // A pass over some layers only (Engine::LayerPass): each token's hidden state at the input of the first
  // layer (dim floats per token of msg, from its first), instead of the token embeddings.
  const float* x_in = nullptr;
  // Where the hidden states a pass captures go, by layer (dim floats per token of msg, from its first), or
  // null.
  std::map<int, std::vector<float>>* captured = nullptr;
  // > 0: only the `candidates` largest of those logits are wanted (a decode sampling with top_k, or greedy),
  // found on the backend (model::Batch::top_k) when every work of the pass wants candidates; then `logits`
  // holds their values and `candidate_ids` their tokens. Otherwise `logits` holds every logit and
  // `candidate_ids` is empty.
  int candidates = 0;
  std::vector<int32_t> candidate_ids;
  // Per view: the call's own copy of that parent's pages, with the K/V its repair policy recomputed (null:
  // the parent's pages, as cached; empty: no view repaired). runtime/engine/repair.cc.
  std::vector<std::unique_ptr<kv::PageList>> repaired;
  // Per view repaired: the pages the call reads it from, the copy's and then the parent's own after the
  // copy's (a policy that recomputes only the first tokens copies only their pages).
  std::vector<std::vector<kernels::PageId>> repaired_pages;
  // first:K's recomputation, not run yet: (view, token) of each repaired token, in order. The work's first
  // encoding pass runs them with its own rows (Engine::encode_on), which write every row's K/V at a layer
  // before any row attends, so the call reads them as recomputed at every layer, and no pass of their own.
  std::vector<std::pair<size_t, int>> pending_repair;
};

/// One token of a repaired view that a repair pass recomputes: of the pass's jobs[job], views[view], token
/// `token` of it.
struct Engine::RepairRow {
  size_t job = 0;
  size_t view = 0;
  int token = 0;
};

}  // namespace choreo::runtime
