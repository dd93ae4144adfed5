#pragma once
// Helpers shared by the persistent-store tests: synthetic entries whose page bytes are a pure function of
// the key (so any reader can recompute what must be there).

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/store/disk_store.h"
#include "runtime/store/entry_format.h"
#include "tests/scratch_dir.h"

namespace choreo::testing {

/// What `choreo encode` says it did with the store: "store DIR: N tokens computed, M loaded from the store"
/// -> (N, M); (-1, -1) when the line is absent.
inline std::pair<int, int> computed_and_loaded(const std::string& output) {
  std::smatch m;
  static const std::regex kLine(R"((\d+) tokens computed, (\d+) loaded from the store)");
  if (!std::regex_search(output, m, kLine)) return {-1, -1};
  return {std::stoi(m[1]), std::stoi(m[2])};
}

/// Collects a DiskStore's warnings.
struct Warnings {
  std::vector<std::string> lines;
  store::WarningSink sink() {
    return [this](const std::string& line) { lines.push_back(line); };
  }
  /// True when some warning contains `what`.
  bool any(const std::string& what) const {
    for (const std::string& l : lines)
      if (l.find(what) != std::string::npos) return true;
    return false;
  }
};

/// Sets an environment variable for the scope (unsets it for a null value), restoring the old value after.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(std::string n, const char* value) : name(std::move(n)) {
    if (const char* v = std::getenv(name.c_str())) old = v;
    if (value)
      ::setenv(name.c_str(), value, 1);
    else
      ::unsetenv(name.c_str());
  }
  ~ScopedEnv() {
    if (old)
      ::setenv(name.c_str(), old->c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
};

/// An entry with synthetic tokens and K/V, deterministic in (key, n_tokens, layout).
struct SyntheticEntry {
  store::EntryMeta meta;
  std::vector<std::vector<float>> pages;
  std::vector<const std::byte*> page_pointers() const {
    std::vector<const std::byte*> p;
    for (const auto& page : pages) p.push_back(reinterpret_cast<const std::byte*>(page.data()));
    return p;
  }
};

inline kernels::KvLayout small_layout() {
  kernels::KvLayout l;
  l.page_tokens = 4;
  l.n_layers = 2;
  l.n_kv_heads = 2;
  l.head_dim = 4;
  return l;
}

inline SyntheticEntry synthetic_entry(uint64_t key, int n_tokens, uint64_t fingerprint,
                                      const kernels::KvLayout& layout = small_layout()) {
  SyntheticEntry e;
  e.meta.model_fingerprint = fingerprint;
  e.meta.content_key = key;
  e.meta.tag = key ^ 0x5a5a;
  e.meta.model_name = "synthetic.gguf";
  e.meta.start_pos = 1;
  e.meta.agent = "agent-" + std::to_string(key % 7);
  e.meta.layout = layout;
  e.meta.parents = {{key * 3 + 1, 1}, {key * 5 + 2, 9}};
  std::mt19937_64 rng(key);
  for (int i = 0; i < n_tokens; ++i) e.meta.tokens.push_back(int(rng() % 1000));
  for (size_t p = 0; p < e.meta.n_pages(); ++p) {
    std::vector<float> page(layout.page_bytes() / sizeof(float));
    for (float& x : page) x = float(int64_t(rng() % 2000001) - 1000000) / 1000.0f;
    e.pages.push_back(std::move(page));
  }
  return e;
}

}  // namespace choreo::testing
