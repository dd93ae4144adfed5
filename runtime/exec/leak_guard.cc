#include "runtime/exec/leak_guard.h"

namespace choreo::exec {

size_t LeakGuard::index_of(kv::MessageId id) {
  if (auto it = index_.find(id); it != index_.end()) return it->second;
  // Copy the parents: registering them may grow the store's tables but never changes a published message.
  const std::vector<kv::PlacedParent> placed = engine_.store().get(id).parents;
  std::vector<size_t> parents;
  for (const kv::PlacedParent& p : placed) parents.push_back(index_of(p.message));
  const kv::Message& m = engine_.store().get(id);
  const size_t i = graph_.add(m.visibility == kv::Visibility::Private ? m.agent : std::string(), parents);
  index_.emplace(id, i);
  ids_.push_back(id);
  return i;
}

std::set<std::string> LeakGuard::taint(kv::MessageId id) {
  std::set<std::string> agents;
  for (size_t source : graph_.carried(index_of(id))) agents.insert(graph_.owner(source));
  return agents;
}

kv::MessageId LeakGuard::clean(kv::MessageId id, const std::string& reader) {
  const size_t i = graph_.clean(index_of(id), reader, [&](size_t original, const auto& parents) {
    const kv::Message& m = engine_.store().get(ids_[original]);
    runtime::PrefillRequest fresh;
    fresh.tokens = m.tokens;
    fresh.new_offset = m.start_pos;
    fresh.agent = m.agent;
    fresh.visibility = m.visibility;
    const std::vector<kv::PlacedParent> placed = m.parents;
    bool dropped = false;
    for (size_t k = 0; k < placed.size(); ++k) {
      if (!parents[k]) {
        dropped = true;  // the leak itself
        continue;
      }
      fresh.parents.push_back({ids_[*parents[k]], placed[k].offset, std::nullopt});
    }
    if (dropped) {
      // Placed as if the private parent had never been listed: the default rule closes its gap, so not even
      // its length can reach the reader through positions.
      fresh.new_offset.reset();
      for (runtime::Parent& p : fresh.parents) p.offset.reset();
    }
    ++n_reencoded_;
    return index_of(engine_.prefill(fresh).id);
  });
  return ids_[i];
}

template <typename Request>
int LeakGuard::apply_to(std::vector<Request>& requests) {
  const int before = n_reencoded_;
  if (engine_.mode() != runtime::Mode::Choreo) return 0;
  // A parent given with its default offset keeps the placement it would have had: the cleaned copy has the
  // same length, so the default rule places it (and everything after it) exactly as before.
  for (Request& r : requests)
    for (runtime::Parent& p : r.parents) p.message = clean(p.message, r.agent);
  return n_reencoded_ - before;
}

int LeakGuard::apply(std::vector<runtime::PrefillRequest>& requests) { return apply_to(requests); }
int LeakGuard::apply(std::vector<runtime::DecodeRequest>& requests) { return apply_to(requests); }

}  // namespace choreo::exec
