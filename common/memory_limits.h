#pragma once
// What the process's memory limits leave of its address space. A limit set with `ulimit -v` (RLIMIT_AS) or
// `ulimit -d` (RLIMIT_DATA) makes an allocation fail long before the machine runs out of memory: the KV pool
// and a many-instance run's workers look here first, so that a run under such a limit completes with less
// at once instead of failing part way (docs/limits.md).

#include <cstdint>
#include <optional>

namespace choreo {

/// Address space kept free under a limit for what a run allocates as it goes (batch buffers, the values of
/// running instances): the KV pool stops growing, and a many-instance run starts no more workers, short of
/// it. A quarter of the limit when that is less.
inline constexpr uint64_t kAddressSpaceReserveBytes = uint64_t(512) << 20;

/// Bytes left under each limit: RLIMIT_AS against every mapping (VmSize), RLIMIT_DATA against the writable
/// private ones, thread stacks included (VmData). Each is nullopt when its limit is unlimited or the use
/// cannot be read.
struct AddressSpaceLeft {
  std::optional<uint64_t> address_bytes, data_bytes;
  /// What to keep free: kAddressSpaceReserveBytes, or a quarter of the smaller limit (0 without limits).
  uint64_t reserve_bytes = 0;
  /// Whether any limit is set.
  bool limited() const { return address_bytes || data_bytes; }
  /// The lesser of the two; nullopt when neither limit is set.
  std::optional<uint64_t> least() const;
};
AddressSpaceLeft address_space_left();

/// The value of a "Name:\tvalue" line of /proc/self/status (a count, or kB for sizes); nullopt when absent.
std::optional<long> proc_status_field(const char* name);

}  // namespace choreo
