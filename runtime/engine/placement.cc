#include "runtime/engine/placement.h"

#include <algorithm>

#include "common/error.h"

namespace choreo::runtime {

Placement place(const kv::MessageStore& store, std::span<const Parent> parents, std::optional<int> new_offset,
                int first_pos, int n_new_tokens, int n_ctx, bool require_encoded) {
  Placement out;
  int cursor = first_pos;
  int max_end = first_pos;
  for (size_t i = 0; i < parents.size(); ++i) {
    const Parent& p = parents[i];
    if (!store.contains(p.message))
      throw InputError(fmt::format("parent #{} refers to unknown message {}", i, p.message));
    const kv::Message& m = store.get(p.message);
    int len = int(m.tokens.size());
    if (p.n_tokens) {
      if (*p.n_tokens < 0 || *p.n_tokens > len)
        throw InputError(fmt::format("parent #{} asks for {} tokens of a {}-token message", i, *p.n_tokens, len));
      len = *p.n_tokens;
    }
    if (require_encoded && len > m.n_encoded)
      throw InputError(fmt::format("parent #{} (message {}) is not fully encoded", i, p.message),
                       "a message can be a parent only after its own call has finished");
    int off = p.offset.value_or(cursor);
    if (off < 0) throw InputError(fmt::format("parent #{} has negative offset {}", i, off));
    if (off + len > n_ctx)
      throw InputError(fmt::format("parent #{} placed at {} ends at {}, beyond the context of {}", i, off,
                                   off + len, n_ctx),
                       "use smaller offsets or fewer parents");
    out.parents.push_back({p.message, off, len, off - m.start_pos});
    cursor = off + len;
    max_end = std::max(max_end, off + len);
  }
  out.new_start = new_offset.value_or(max_end);
  if (out.new_start < 0) throw InputError(fmt::format("new_offset {} is negative", out.new_start));
  if (out.new_start + n_new_tokens > n_ctx)
    throw InputError(fmt::format("context overflow: the new message would end at position {}, beyond the "
                                 "model's context of {}", out.new_start + n_new_tokens, n_ctx),
                     "lower max_tokens, new_offset or the parents' total length");
  return out;
}

kv::Message& new_message(kv::MessageStore& store, const Placement& placement, const std::string& agent,
                         kv::Visibility visibility, std::vector<Token> tokens, int model) {
  kv::Message& m = store.create();
  m.model = model;
  m.start_pos = placement.new_start;
  for (const PlacedView& v : placement.parents) {
    const int whole = int(store.get(v.message).tokens.size());
    m.parents.push_back({v.message, v.offset, v.n_tokens == whole ? -1 : v.n_tokens});
  }
  m.agent = agent;
  m.visibility = visibility;
  m.tokens = std::move(tokens);
  return m;
}

}  // namespace choreo::runtime
