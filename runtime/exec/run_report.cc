#include "runtime/exec/run_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>

namespace choreo::exec {

nlohmann::ordered_json run_json(const RunResult& r) {
  nlohmann::ordered_json j;
  j["messages"] = nlohmann::ordered_json::array();
  for (const MessageRecord& m : r.messages) {
    nlohmann::ordered_json e;
    e["name"] = m.name;
    e["kind"] = m.kind;
    e["id"] = m.id;
    e["agent"] = m.agent;
    e["private"] = m.is_private;
    e["parents"] = m.parents;
    e["text"] = m.text;
    if (m.kind == "decode") {
      e["stop_reason"] = m.stop_reason;
      e["n_generated"] = m.n_generated;
    }
    e["tokens"] = m.tokens;
    e["start_pos"] = m.start_pos;
    e["n_computed"] = m.n_computed;
    e["n_reused"] = m.n_reused;
    e["n_loaded"] = m.n_loaded;
    e["n_recomputed"] = m.n_recomputed;
    if (!m.model.empty()) e["model"] = m.model;
    if (m.n_cross_model > 0) e["n_cross_model"] = m.n_cross_model;
    if (m.n_repaired > 0) e["n_repaired"] = m.n_repaired;
    e["load_ms"] = m.load_ms;
    e["ttft_ms"] = m.ttft_ms;
    e["total_ms"] = m.total_ms;
    j["messages"].push_back(e);
  }
  j["batches"] = nlohmann::ordered_json::array();
  for (const BatchRecord& b : r.batches) j["batches"].push_back({{"kind", b.kind}, {"size", b.size}});
  j["output"] = r.output;
  return j;
}

nlohmann::ordered_json trace_json(const std::vector<TracedRun>& runs, std::span<const kv::TierEvent> tier_events) {
  double origin = std::numeric_limits<double>::infinity();
  for (const TracedRun& run : runs) {
    for (const MessageRecord& m : run.result->messages) origin = std::min(origin, m.start_ms);
    for (const StepSample& s : run.result->steps) origin = std::min(origin, s.ms);
  }
  for (const kv::TierEvent& e : tier_events) origin = std::min(origin, e.start_ms);
  auto micros = [&](double ms) { return (ms - origin) * 1000.0; };

  nlohmann::ordered_json events = nlohmann::ordered_json::array();
  for (size_t pid = 0; pid < runs.size(); ++pid) {
    const RunResult& result = *runs[pid].result;
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", runs[pid].label}}}});
    std::map<std::string, int> tracks;  // agent → thread id, in order of first appearance
    for (const MessageRecord& m : result.messages) {
      const std::string agent = m.agent.empty() ? "(no agent)" : m.agent;
      auto [it, added] = tracks.emplace(agent, int(tracks.size()));
      if (added)
        events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", it->second},
                          {"args", {{"name", agent}}}});
      nlohmann::ordered_json args = {{"kind", m.kind},
                                     {"tokens", m.tokens.size()},
                                     {"computed", m.n_computed},
                                     {"reused", m.n_reused},
                                     {"start_pos", m.start_pos}};
      if (m.kind == "decode") {
        args["generated"] = m.n_generated;
        args["ttft_ms"] = m.ttft_ms;
        args["stop_reason"] = m.stop_reason;
      }
      events.push_back({{"name", m.name}, {"cat", m.kind}, {"ph", "X"}, {"ts", micros(m.start_ms)},
                        {"dur", m.total_ms * 1000.0}, {"pid", pid}, {"tid", it->second}, {"args", args}});
      if (m.kind == "decode" && m.n_generated > 0)
        events.push_back({{"name", "first token"}, {"cat", "ttft"}, {"ph", "X"}, {"ts", micros(m.start_ms)},
                          {"dur", m.ttft_ms * 1000.0}, {"pid", pid}, {"tid", it->second}});
    }
    // Steps-to-execution: one counter track per agent, a value after each plan step (-1: never again).
    for (const StepSample& s : result.steps)
      for (const auto& [agent, steps] : s.agents)
        events.push_back({{"name", "steps to " + agent},
                          {"cat", "steps"},
                          {"ph", "C"},
                          {"ts", micros(s.ms)},
                          {"pid", pid},
                          {"args", {{"steps", steps ? int64_t(*steps) : int64_t(-1)}}}});
  }
  if (!tier_events.empty()) {
    const size_t pid = runs.size();
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", "KV tiers"}}}});
    std::map<std::string, int> tracks;
    for (const kv::TierEvent& e : tier_events) {
      auto [it, added] = tracks.emplace(kv::track_name(e), int(tracks.size()));
      if (added)
        events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", it->second},
                          {"args", {{"name", it->first}}}});
      events.push_back({{"name", fmt::format("message {}", e.message)},
                        {"cat", "tiers"},
                        {"ph", "X"},
                        {"ts", micros(e.start_ms)},
                        {"dur", (e.end_ms - e.start_ms) * 1000.0},
                        {"pid", pid},
                        {"tid", it->second},
                        {"args", {{"message", e.message}, {"tokens", e.tokens}, {"bytes", e.bytes}}}});
    }
  }
  return {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
}

}  // namespace choreo::exec
