#pragma once
// How far a choreographed run is from the exact one (`choreo profile quality`, docs/profile.md "How far from
// exact"). The baseline (prefix mode: every decode a plain chat call over its flat prompt) is exact; a
// choreo-mode run reads cached parents encoded without seeing each other. To compare the two on the same
// token sequences, the choreo run is teacher-forced to the tokens the baseline generated, and each decode
// call is compared position by position: the KL divergence of its next-token distributions from the
// baseline's, the rank of the baseline's token, and whether its argmax is that token. quality_profile.h runs
// this over the instances of a workflow and sums it up.

#include <string>
#include <vector>

#include "dsl/workflow.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/interpreter.h"

namespace choreo::eval {

/// One decode call of a teacher-forced run compared with the same call of the baseline, over the positions of
/// the baseline's generated tokens. Sums, so that figures of several calls combine weighted by positions.
struct CallQuality {
  std::string call;     ///< the bound name (`answer[1][2]`)
  std::string step;     ///< its decode batch's label in the baseline (`answer[1][*]`; `L #k` for the k-th L)
  int n_positions = 0;  ///< generated tokens compared
  double kl_sum = 0;    ///< sum over positions of KL(baseline || run) of the next-token distributions, nats
  double kl_max = 0;    ///< the largest of them
  double rank_sum = 0;  ///< sum over positions of the baseline token's rank under the run's logits (1: top)
  int rank_max = 0;     ///< the largest of them (0 without positions)
  int n_agree = 0;      ///< positions where the run's argmax is the baseline's token
  /// What an exact run would give for the last two: the rank of the baseline's token under the baseline's
  /// own logits, and whether its argmax is that token (below 1 and above 0 where the baseline sampled).
  double exact_rank_sum = 0;
  int n_agree_exact = 0;
  int baseline_computed = 0;  ///< tokens the call computed in the baseline run
  int computed = 0;           ///< ... and in the compared run

  double kl() const { return n_positions ? kl_sum / n_positions : 0.0; }
  double rank() const { return n_positions ? rank_sum / n_positions : 0.0; }
  double agreement() const { return n_positions ? double(n_agree) / n_positions : 0.0; }
  double exact_rank() const { return n_positions ? exact_rank_sum / n_positions : 0.0; }
  double exact_agreement() const { return n_positions ? double(n_agree_exact) / n_positions : 0.0; }
  /// Adds another call's positions and computed tokens (a step's or a run's figures over several calls).
  void add(const CallQuality& other);
};

/// The figures at one position: the baseline's logits `p`, the compared run's `q`, and the token the baseline
/// generated there. `into` gets them added (n_positions, sums, maxima).
void add_position(CallQuality& into, std::span<const float> p, std::span<const float> q, Token token);

/// The baseline run of an instance: `workflow` on `engine` (prefix mode), every decode's logits recorded.
exec::RunResult run_baseline(const dsl::Workflow& workflow, runtime::Engine& engine,
                             const exec::RunArguments& arguments);

/// A run teacher-forced to `baseline`: `workflow` on `engine`, each decode generating exactly what the decode
/// of the same name (and occurrence: the k-th decode named N gets the k-th one's tokens) generated in
/// `baseline`, every decode's logits recorded. Decodes with no counterpart run as the workflow says; their
/// number is added to `n_unforced`.
exec::RunResult run_teacher_forced(const dsl::Workflow& workflow, runtime::Engine& engine,
                                   const exec::RunArguments& arguments, const exec::RunResult& baseline,
                                   int& n_unforced);

/// Compares every decode of `run` with the baseline's decode of the same name and occurrence, in the
/// baseline's order, over the positions both recorded logits for (both runs recorded with run_baseline and
/// run_teacher_forced). A baseline decode the run did not make, or made generating other tokens (not forced),
/// is left out.
std::vector<CallQuality> compare_calls(const exec::RunResult& baseline, const exec::RunResult& run);

}  // namespace choreo::eval
