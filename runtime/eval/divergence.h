#pragma once
// How far one next-token distribution is from another, computed from two rows of logits in double: the KL
// divergence of their softmaxes, the rank a token has under one of them, and its argmax. The reuse profiler
// (reuse_profile.h) and the quality profiler (quality.h) score teacher-forced runs against a reference with
// these.

#include <span>
#include <vector>

#include "common/token.h"

namespace choreo::eval {

/// log softmax(logits), in double.
std::vector<double> log_softmax(std::span<const float> logits);

/// KL(p || q) in nats of the softmaxes of two rows of logits of one vocabulary (asserted equal lengths):
/// sum_i p_i (log p_i - log q_i), in double, clamped at 0 against rounding.
double kl_divergence(std::span<const float> p_logits, std::span<const float> q_logits);

/// Mean KL(p || q) over rows of logits, the rows paired in order up to the shorter list (0 when none).
double mean_kl(const std::vector<std::vector<float>>& p_logits,
               const std::vector<std::vector<float>>& q_logits);

/// The rank of `token` under `logits`: 1 + the number of tokens with a strictly larger logit (so a token tied
/// with the largest has rank 1).
int token_rank(std::span<const float> logits, Token token);

}  // namespace choreo::eval
