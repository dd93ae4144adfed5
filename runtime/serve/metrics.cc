#include "runtime/serve/metrics.h"

#include <fmt/format.h>

namespace choreo::serve {

void Histogram::observe(double seconds) {
  for (size_t i = 0; i < kBounds.size(); ++i)
    if (seconds <= kBounds[i]) ++counts_[i];
  ++count_;
  sum_ += seconds;
}

std::string Histogram::render(const std::string& name, const std::string& help) const {
  std::string out = fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  for (size_t i = 0; i < kBounds.size(); ++i) out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, kBounds[i], counts_[i]);
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name, sum_, name, count_);
  return out;
}

void Metrics::request(const std::string& endpoint, int status) {
  std::lock_guard lock(mutex_);
  ++requests_[{endpoint, status}];
}

void Metrics::generation(const PromptUsage& usage, int generated, double ttft_s, double total_s) {
  std::lock_guard lock(mutex_);
  prefix_reused_ += uint64_t(usage.prefix_reused);
  out_of_prefix_ += uint64_t(usage.reused_out_of_prefix);
  computed_ += uint64_t(usage.computed);
  recomputed_ += uint64_t(usage.recomputed);
  loaded_[1] += uint64_t(usage.loaded_t1);
  loaded_[2] += uint64_t(usage.loaded_t2);
  loaded_[3] += uint64_t(usage.loaded_t3);
  generated_ += uint64_t(generated);
  ttft_.observe(ttft_s);
  total_.observe(total_s);
}

std::string Metrics::render(const std::string& gauges) const {
  std::lock_guard lock(mutex_);
  std::string out = "# HELP choreo_requests_total HTTP requests answered, by endpoint and status.\n"
                    "# TYPE choreo_requests_total counter\n";
  for (const auto& [key, n] : requests_)
    out += fmt::format("choreo_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", key.first, key.second, n);
  out += fmt::format(
      "# HELP choreo_prompt_tokens_total Prompt tokens of generations, by where their KV came from: reused as a "
      "prefix (a prefix-cache hit), reused out of prefix (choreo's item_reference parents), or computed.\n"
      "# TYPE choreo_prompt_tokens_total counter\n"
      "choreo_prompt_tokens_total{{source=\"reused\"}} {}\n"
      "choreo_prompt_tokens_total{{source=\"reused_out_of_prefix\"}} {}\n"
      "choreo_prompt_tokens_total{{source=\"computed\"}} {}\n"
      "# HELP choreo_prompt_loaded_tokens_total Reused prompt tokens that were brought back to T0 from a lower "
      "tier first, by tier, and those recomputed because no tier held them.\n"
      "# TYPE choreo_prompt_loaded_tokens_total counter\n"
      "choreo_prompt_loaded_tokens_total{{tier=\"t1\"}} {}\n"
      "choreo_prompt_loaded_tokens_total{{tier=\"t2\"}} {}\n"
      "choreo_prompt_loaded_tokens_total{{tier=\"t3\"}} {}\n"
      "choreo_prompt_recomputed_tokens_total {}\n"
      "# HELP choreo_generated_tokens_total Tokens generated.\n"
      "# TYPE choreo_generated_tokens_total counter\n"
      "choreo_generated_tokens_total {}\n",
      prefix_reused_, out_of_prefix_, computed_, loaded_[1], loaded_[2], loaded_[3], recomputed_, generated_);
  out += ttft_.render("choreo_ttft_seconds", "Time from a request's arrival to its first generated token.");
  out += total_.render("choreo_request_seconds", "Time from a request's arrival to its last generated token.");
  return out + gauges;
}

std::string render_tiers(const kv::TierStats& t, size_t t1_in_use_bytes, size_t t1_budget_bytes) {
  return fmt::format(
      "# HELP choreo_t1_bytes KV bytes held in T1 (host memory) and its budget (--host-cache-mib).\n"
      "# TYPE choreo_t1_bytes gauge\n"
      "choreo_t1_bytes{{kind=\"in_use\"}} {}\n"
      "choreo_t1_bytes{{kind=\"budget\"}} {}\n"
      "# HELP choreo_tier_evictions_total Messages whose KV left a tier for room: T0 (to T1, T2, or dropped), T1.\n"
      "# TYPE choreo_tier_evictions_total counter\n"
      "choreo_tier_evictions_total{{tier=\"t0\"}} {}\n"
      "choreo_tier_evictions_total{{tier=\"t1\"}} {}\n"
      "# HELP choreo_tier_writes_total Messages written to a tier: T1 (offloaded from T0), T2 (on eviction, or "
      "as made with --write-through), T3 (every prefill, as made); and their bytes.\n"
      "# TYPE choreo_tier_writes_total counter\n"
      "choreo_tier_writes_total{{tier=\"t1\"}} {}\n"
      "choreo_tier_writes_total{{tier=\"t2\"}} {}\n"
      "choreo_tier_writes_total{{tier=\"t3\"}} {}\n"
      "choreo_tier_write_bytes_total{{tier=\"t1\"}} {}\n"
      "choreo_tier_write_bytes_total{{tier=\"t2\"}} {}\n"
      "choreo_tier_write_bytes_total{{tier=\"t3\"}} {}\n"
      "# HELP choreo_tier_loads_total Messages brought back to T0 from a tier by the call that needed them, and "
      "their tokens and bytes.\n"
      "# TYPE choreo_tier_loads_total counter\n"
      "choreo_tier_loads_total{{tier=\"t1\"}} {}\n"
      "choreo_tier_loads_total{{tier=\"t2\"}} {}\n"
      "choreo_tier_loads_total{{tier=\"t3\"}} {}\n"
      "choreo_tier_load_tokens_total{{tier=\"t1\"}} {}\n"
      "choreo_tier_load_tokens_total{{tier=\"t2\"}} {}\n"
      "choreo_tier_load_tokens_total{{tier=\"t3\"}} {}\n"
      "choreo_tier_load_bytes_total{{tier=\"t1\"}} {}\n"
      "choreo_tier_load_bytes_total{{tier=\"t2\"}} {}\n"
      "choreo_tier_load_bytes_total{{tier=\"t3\"}} {}\n"
      "# HELP choreo_tier_bad_entries_total Store entries that failed a check (recomputed instead).\n"
      "# TYPE choreo_tier_bad_entries_total counter\n"
      "choreo_tier_bad_entries_total{{tier=\"t2\"}} {}\n"
      "choreo_tier_bad_entries_total{{tier=\"t3\"}} {}\n"
      "# HELP choreo_tier_prefetches_total Loads into T0 started ahead of the call reading them (--prefetch-steps), "
      "those a call then read, and those evicted again unread.\n"
      "# TYPE choreo_tier_prefetches_total counter\n"
      "choreo_tier_prefetches_total{{event=\"started\"}} {}\n"
      "choreo_tier_prefetches_total{{event=\"used\"}} {}\n"
      "choreo_tier_prefetches_total{{event=\"wasted\"}} {}\n"
      "# HELP choreo_tier_recomputes_total Messages recomputed because no tier held them, and their tokens.\n"
      "# TYPE choreo_tier_recomputes_total counter\n"
      "choreo_tier_recomputes_total {}\n"
      "choreo_tier_recomputed_tokens_total {}\n",
      t1_in_use_bytes, t1_budget_bytes, t.t0_evictions, t.t1_evictions, t.t1_offloads, t.t2.writes, t.t3.writes,
      t.t1_offload_bytes, t.t2.write_bytes, t.t3.write_bytes, t.t1_hits, t.t2.hits, t.t3.hits, t.t1_load_tokens,
      t.t2.load_tokens, t.t3.load_tokens, t.t1_load_bytes, t.t2.load_bytes, t.t3.load_bytes, t.t2.bad, t.t3.bad,
      t.prefetches, t.prefetch_used, t.prefetch_wasted, t.recomputes, t.recomputed_tokens);
}

}  // namespace choreo::serve
