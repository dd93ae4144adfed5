#include "common/memory_limits.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace choreo {

namespace {

/// Bytes left under `resource` given what `used_field` of /proc/self/status (in kB) says is used; the limit
/// goes to `least_limit` when it is less.
std::optional<uint64_t> room_under(int resource, const char* used_field, uint64_t& least_limit) {
  rlimit limit{};
  if (::getrlimit(resource, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return std::nullopt;
  const std::optional<long> used_kib = proc_status_field(used_field);
  if (!used_kib) return std::nullopt;
  least_limit = std::min<uint64_t>(least_limit, limit.rlim_cur);
  const uint64_t used = uint64_t(*used_kib) * 1024;
  return uint64_t(limit.rlim_cur) > used ? uint64_t(limit.rlim_cur) - used : 0;
}

}  // namespace

std::optional<uint64_t> AddressSpaceLeft::least() const {
  if (address_bytes && data_bytes) return std::min(*address_bytes, *data_bytes);
  return address_bytes ? address_bytes : data_bytes;
}

AddressSpaceLeft address_space_left() {
  // Without limits (the usual case) /proc is not read at all.
  uint64_t least_limit = UINT64_MAX;
  AddressSpaceLeft out;
  out.address_bytes = room_under(RLIMIT_AS, "VmSize", least_limit);
  out.data_bytes = room_under(RLIMIT_DATA, "VmData", least_limit);
  if (out.limited()) out.reserve_bytes = std::min(kAddressSpaceReserveBytes, least_limit / 4);
  return out;
}

std::optional<long> proc_status_field(const char* name) {
  // stdio rather than iostreams: this is read on the way to allocating KV pages, and must not allocate much.
  std::FILE* file = std::fopen("/proc/self/status", "re");
  if (!file) return std::nullopt;
  char line[256];
  const size_t length = std::strlen(name);
  std::optional<long> value;
  while (std::fgets(line, sizeof line, file))
    if (std::strncmp(line, name, length) == 0 && line[length] == ':') {
      value = std::strtol(line + length + 1, nullptr, 10);
      break;
    }
  std::fclose(file);
  return value;
}

}  // namespace choreo
