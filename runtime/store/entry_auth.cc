#include "runtime/store/entry_auth.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/error.h"

namespace choreo::store {

namespace {

// Domain separation: the entry-MAC key is HMAC(secret, this label), so another use of the same key file
// (another tier, another format) derives a different key from another label.
constexpr std::string_view kEntryKeyLabel = "choreo store entry MAC v1";

void init_sodium() {
  if (::sodium_init() < 0) throw RuntimeFailure("cannot initialise libsodium");
}

/// The bytes of a key file, every check of from_key_file applied.
std::vector<uint8_t> read_key_file(const std::string& path) {
  const std::string hint =
      "a store key file holds 32 to 4096 secret bytes and is readable only by its owner, "
      "e.g. `head -c 32 /dev/urandom > KEY && chmod 600 KEY`";
  // O_NONBLOCK: a FIFO put where the key should be must not block the process (it is refused below).
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    throw InputError(fmt::format("cannot open the store key file '{}': {}", path, std::strerror(errno)),
                     hint);
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(fmt::format("the store key file '{}' is not a regular file", path), hint);
  }
  if ((st.st_mode & 077) != 0) {
    ::close(fd);
    throw InputError(
        fmt::format("the store key file '{}' is accessible by group or others (mode {:03o})", path,
                    unsigned(st.st_mode & 0777)),
        fmt::format("chmod 600 '{}' (anyone who can read the key can forge store entries)", path));
  }
  std::vector<uint8_t> bytes(kMaxKeyBytes + 1);
  size_t n = 0;
  while (n < bytes.size()) {
    ssize_t got = ::read(fd, bytes.data() + n, bytes.size() - n);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int err = errno;
      ::close(fd);
      throw InputError(fmt::format("cannot read the store key file '{}': {}", path, std::strerror(err)),
                       hint);
    }
    if (got == 0) break;
    n += size_t(got);
  }
  ::close(fd);
  bytes.resize(n);
  return bytes;
}

}  // namespace

EntryAuthenticator EntryAuthenticator::from_secret(std::span<const uint8_t> secret, std::string_view origin) {
  if (secret.size() < kMinKeyBytes || secret.size() > kMaxKeyBytes)
    throw InputError(
        fmt::format("the store key {} has {} bytes; it needs {} to {}", origin,
                    secret.size() > kMaxKeyBytes ? "more than 4096" : std::to_string(secret.size()),
                    kMinKeyBytes, kMaxKeyBytes),
        "e.g. `head -c 32 /dev/urandom > KEY && chmod 600 KEY`");
  init_sodium();
  EntryAuthenticator auth;
  crypto_auth_hmacsha256_state state;
  crypto_auth_hmacsha256_init(&state, secret.data(), secret.size());
  crypto_auth_hmacsha256_update(&state, reinterpret_cast<const unsigned char*>(kEntryKeyLabel.data()),
                                kEntryKeyLabel.size());
  crypto_auth_hmacsha256_final(&state, auth.key_.data());
  ::sodium_memzero(&state, sizeof(state));
  return auth;
}

EntryAuthenticator EntryAuthenticator::from_key_file(const std::string& path) {
  std::vector<uint8_t> secret = read_key_file(path);
  try {
    EntryAuthenticator auth = from_secret(secret, fmt::format("file '{}'", path));
    ::sodium_memzero(secret.data(), secret.size());
    return auth;
  } catch (...) {
    ::sodium_memzero(secret.data(), secret.size());
    throw;
  }
}

EntryAuthenticator::~EntryAuthenticator() { ::sodium_memzero(key_.data(), key_.size()); }

Mac EntryAuthenticator::mac(std::span<const std::span<const uint8_t>> parts) const {
  crypto_auth_hmacsha256_state state;
  crypto_auth_hmacsha256_init(&state, key_.data(), key_.size());
  for (std::span<const uint8_t> part : parts) crypto_auth_hmacsha256_update(&state, part.data(), part.size());
  Mac tag;
  crypto_auth_hmacsha256_final(&state, tag.data());
  ::sodium_memzero(&state, sizeof(state));
  return tag;
}

bool EntryAuthenticator::verify(std::span<const std::span<const uint8_t>> parts, const Mac& tag) const {
  const Mac expected = mac(parts);
  return ::crypto_verify_32(expected.data(), tag.data()) == 0;
}

std::optional<EntryAuthenticator> configured_authenticator(std::string_view flag_path) {
  if (!flag_path.empty()) return EntryAuthenticator::from_key_file(std::string(flag_path));
  if (const char* env = std::getenv("CHOREO_STORE_KEY_FILE"); env && *env)
    return EntryAuthenticator::from_key_file(env);
  return std::nullopt;
}

}  // namespace choreo::store
