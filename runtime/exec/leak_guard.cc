#include "runtime/exec/leak_guard.h"

namespace choreo::exec {

namespace {

bool private_to_other(const kv::Message& m, const std::string& reader) {
  return m.visibility == kv::Visibility::Private && m.agent != reader;
}

}  // namespace

const std::set<std::string>& LeakGuard::taint(kv::MessageId id) {
  auto it = taint_.find(id);
  if (it != taint_.end()) return it->second;
  std::set<std::string> agents;
  // Copy the parents: the recursion may add entries to taint_ but never changes a published message.
  const std::vector<kv::PlacedParent> parents = engine_.store().get(id).parents;
  for (const kv::PlacedParent& p : parents) {
    const kv::Message& parent = engine_.store().get(p.message);
    if (parent.visibility == kv::Visibility::Private) agents.insert(parent.agent);
    const std::set<std::string>& inherited = taint(p.message);
    agents.insert(inherited.begin(), inherited.end());
  }
  return taint_.emplace(id, std::move(agents)).first->second;
}

bool LeakGuard::leaks_to(kv::MessageId id, const std::string& reader) {
  for (const std::string& agent : taint(id))
    if (agent != reader) return true;
  return false;
}

kv::MessageId LeakGuard::clean(kv::MessageId id, const std::string& reader) {
  if (!leaks_to(id, reader)) return id;
  const auto key = std::make_pair(id, reader);
  if (auto it = cleaned_.find(key); it != cleaned_.end()) return it->second;

  const kv::Message& m = engine_.store().get(id);
  runtime::PrefillRequest fresh;
  fresh.tokens = m.tokens;
  fresh.new_offset = m.start_pos;
  fresh.agent = m.agent;
  fresh.visibility = m.visibility;
  const std::vector<kv::PlacedParent> parents = m.parents;
  bool dropped = false;
  for (const kv::PlacedParent& p : parents) {
    if (private_to_other(engine_.store().get(p.message), reader)) {
      dropped = true;  // the leak itself
      continue;
    }
    fresh.parents.push_back({clean(p.message, reader), p.offset, std::nullopt});
  }
  if (dropped) {
    // Placed as if the private parent had never been listed: the default rule closes its gap, so not even
    // its length can reach the reader through positions.
    fresh.new_offset.reset();
    for (runtime::Parent& p : fresh.parents) p.offset.reset();
  }
  const kv::MessageId out = engine_.prefill(fresh).id;
  ++n_reencoded_;
  cleaned_.emplace(key, out);
  return out;
}

void LeakGuard::clean_parents(std::vector<runtime::Parent>& parents, const std::string& reader) {
  // A parent given with its default offset keeps the placement it would have had: the cleaned copy has the
  // same length, so the default rule places it (and everything after it) exactly as before.
  for (runtime::Parent& p : parents) p.message = clean(p.message, reader);
}

template <typename Request>
int LeakGuard::apply_to(std::vector<Request>& requests) {
  const int before = n_reencoded_;
  if (engine_.mode() != runtime::Mode::Choreo) return 0;
  for (Request& r : requests) clean_parents(r.parents, r.agent);
  return n_reencoded_ - before;
}

int LeakGuard::apply(std::vector<runtime::PrefillRequest>& requests) { return apply_to(requests); }
int LeakGuard::apply(std::vector<runtime::DecodeRequest>& requests) { return apply_to(requests); }

}  // namespace choreo::exec
