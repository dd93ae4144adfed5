#pragma once
// Tests that look at or tamper with KV pages do it as a user of the backend would: copy the pages to host
// memory, and copy them back.

#include <cstddef>
#include <cstring>
#include <vector>

#include "runtime/kv/page_pool.h"

namespace choreo::testing {

/// The floats of every page of a list (f32 layouts), page after page.
inline std::vector<float> page_floats(const kv::PageList& pages, size_t n_pages) {
  const std::vector<std::byte> bytes = pages.to_host(n_pages);
  std::vector<float> floats(bytes.size() / sizeof(float));
  std::memcpy(floats.data(), bytes.data(), floats.size() * sizeof(float));
  return floats;
}
inline std::vector<float> page_floats(const kv::PageList& pages) { return page_floats(pages, pages.pages().size()); }

/// Calls edit(page, n_floats) on a host copy of each page (as floats), then writes the pages back.
template <class Edit>
void edit_pages(kv::PageList& pages, Edit edit) {
  const size_t n = pages.pages().size(), bytes = pages.pool().page_bytes();
  std::vector<std::byte> host = pages.to_host(n);
  for (size_t p = 0; p < n; ++p) edit(reinterpret_cast<float*>(host.data() + p * bytes), bytes / sizeof(float));
  pages.upload(host.data(), n);
}

}  // namespace choreo::testing
