#include "runtime/store/entry_store.h"

#include <algorithm>
#include <cstring>

namespace choreo::store {

EntryProblem compatibility_problem(const EntryMeta& m, uint64_t key, const Compatibility& expect) {
  const kernels::KvLayout& want = expect.layout;
  if (m.content_key != key) return EntryProblem::WrongKey;
  if (m.model_fingerprint != expect.model_fingerprint) return EntryProblem::WrongModel;
  if (m.layout.page_tokens != want.page_tokens || m.layout.n_layers != want.n_layers ||
      m.layout.n_kv_heads != want.n_kv_heads || m.layout.head_dim != want.head_dim ||
      m.layout.k_type != want.k_type || m.layout.v_type != want.v_type)
    return EntryProblem::WrongLayout;
  return EntryProblem::Ok;
}

ParsedEntry parse_entry_for(std::span<const uint8_t> bytes, uint64_t key, const Compatibility& expect) {
  ParsedEntry parsed = parse_entry(bytes);
  if (parsed.problem == EntryProblem::Ok) parsed.problem = compatibility_problem(parsed.meta, key, expect);
  return parsed;
}

ParsedEntry check_entry(std::span<const uint8_t> bytes, uint64_t key, const Compatibility& expect,
                        const EntryAuthenticator* auth) {
  ParsedEntry parsed = parse_entry_for(bytes, key, expect);
  if (parsed.problem == EntryProblem::Ok && auth) parsed.problem = check_entry_mac(bytes, parsed, *auth);
  return parsed;
}

const std::byte* entry_page(std::span<const uint8_t> bytes, const ParsedEntry& parsed, size_t i) {
  return reinterpret_cast<const std::byte*>(bytes.data() + parsed.pages_offset + i * parsed.meta.page_bytes());
}

std::map<int, std::vector<float>> e_sections(std::span<const uint8_t> bytes, const ParsedEntry& parsed,
                                             std::span<const int> layers) {
  std::map<int, std::vector<float>> out;
  for (size_t j = 0; j < parsed.meta.e_layers.size(); ++j) {
    const int layer = int(parsed.meta.e_layers[j]);
    if (std::find(layers.begin(), layers.end(), layer) == layers.end()) continue;
    const std::span<const uint8_t> section = e_section(bytes, parsed, j);
    std::vector<float>& rows = out[layer];
    rows.resize(section.size() / sizeof(float));
    std::memcpy(rows.data(), section.data(), section.size());
  }
  return out;
}

std::optional<std::string> read_entry(const StoredEntry& entry, std::span<const kernels::PageId> pages,
                                      kernels::Backend& backend, std::span<const int> e_layers,
                                      std::map<int, std::vector<float>>& e_cache) {
  const ParsedEntry& parsed = entry.parsed();
  if (parsed.meta.n_pages() != pages.size()) return "another page count";
  if (std::optional<std::string> bad = body_damage(entry.bytes(), parsed)) return bad;
  const kernels::Completion copy = backend.copy_pages_from_host(
      entry_page(entry.bytes(), parsed, 0), pages, {0, parsed.meta.page_bytes()});
  e_cache = e_sections(entry.bytes(), parsed, e_layers);
  copy.wait();
  return std::nullopt;
}

}  // namespace choreo::store
