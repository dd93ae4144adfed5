#pragma once
// Helpers shared by the persistent-store tests: synthetic entries whose page bytes are a pure function of
// the key (so any reader can recompute what must be there).

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "runtime/store/entry_format.h"
#include "tests/scratch_dir.h"

namespace choreo::testing {

/// An entry with synthetic tokens and K/V, deterministic in (key, n_tokens, layout).
struct SyntheticEntry {
  store::EntryMeta meta;
  std::vector<std::vector<float>> pages;
  std::vector<const float*> page_pointers() const {
    std::vector<const float*> p;
    for (const auto& page : pages) p.push_back(page.data());
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
    std::vector<float> page(layout.page_floats());
    for (float& x : page) x = float(int64_t(rng() % 2000001) - 1000000) / 1000.0f;
    e.pages.push_back(std::move(page));
  }
  return e;
}

}  // namespace choreo::testing
