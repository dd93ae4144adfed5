#pragma once
// Keyed integrity of store entries (docs/store.md, "Threat model"): the secret read from a key file, and the
// HMAC-SHA256 that an entry carries when its writer had that secret. Nothing here knows where entries live,
// so every tier that keeps entries (the disk store today) signs and verifies them the same way.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace choreo::store {

inline constexpr size_t kMacBytes = 32;
/// An HMAC-SHA256 tag.
using Mac = std::array<uint8_t, kMacBytes>;

/// A key file holds at least this many bytes (the secret is every byte of the file) ...
inline constexpr size_t kMinKeyBytes = 32;
/// ... and at most this many.
inline constexpr size_t kMaxKeyBytes = 4096;

/// Signs and checks store entries under one secret. The secret itself is not kept: only a key derived from
/// it for entry MACs, so a later tier can derive keys of its own from the same file.
class EntryAuthenticator {
 public:
  /// From the secret's bytes; throws InputError when there are fewer than kMinKeyBytes or more than
  /// kMaxKeyBytes. `origin` names where the bytes came from, for that error.
  static EntryAuthenticator from_secret(std::span<const uint8_t> secret, std::string_view origin);
  /// From a key file: a regular file (a symlink to one is fine) of kMinKeyBytes..kMaxKeyBytes bytes that
  /// neither group nor others may read or write. Throws InputError (with a hint) otherwise.
  static EntryAuthenticator from_key_file(const std::string& path);

  EntryAuthenticator(const EntryAuthenticator&) = default;
  EntryAuthenticator& operator=(const EntryAuthenticator&) = default;
  ~EntryAuthenticator();

  /// The HMAC-SHA256 of `parts`, concatenated in order.
  Mac mac(std::span<const std::span<const uint8_t>> parts) const;
  /// True when `tag` is the MAC of `parts` (compared in constant time).
  bool verify(std::span<const std::span<const uint8_t>> parts, const Mac& tag) const;

 private:
  EntryAuthenticator() = default;
  std::array<uint8_t, 32> key_{};
};

/// The store key in force: the file `flag_path` when non-empty (--store-key-file), else the file named by
/// $CHOREO_STORE_KEY_FILE when set and non-empty, else none (the store is unkeyed).
std::optional<EntryAuthenticator> configured_authenticator(std::string_view flag_path = {});

}  // namespace choreo::store
