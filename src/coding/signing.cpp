#include "coding/signing.hpp"

#include <fcntl.h>
#include <stdio.h>  // renameat2 (glibc >= 2.28)
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.hpp"
#include "core/file_read.hpp"

namespace pulse::sync {

namespace {

void init_sodium() { PULSE_CHECK(sodium_init() >= 0, "libsodium failed to initialise"); }

template <std::size_t N>
std::array<std::uint8_t, N> read_key(const std::string& path) {
  const auto bytes = read_regular_file(path, N, "key file");
  PULSE_CHECK(bytes.size() == N, "key file " + path + " holds " + std::to_string(bytes.size()) + " bytes, expected " +
                                     std::to_string(N));
  std::array<std::uint8_t, N> key;
  std::copy(bytes.begin(), bytes.end(), key.begin());
  return key;
}

std::string write_error(const std::string& path, const char* what) {
  return "cannot write key file " + path + ": " + what + " (" + std::strerror(errno) + ")";
}

// Writes all bytes to a new file created with `mode` (O_EXCL: never an existing file, never
// through a symbolic link); on any failure the file is removed and pulse::Error says why.
void write_new_file(const std::string& path, const std::uint8_t* data, std::size_t size, mode_t mode) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  PULSE_CHECK(fd >= 0, write_error(path, "cannot create it"));
  const char* failed = nullptr;
  for (std::size_t done = 0; done < size && !failed;) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) failed = "write failed";
    else done += static_cast<std::size_t>(n);
  }
  if (!failed && ::fsync(fd) != 0) failed = "fsync failed";
  if (::close(fd) != 0 && !failed) failed = "close failed";
  if (failed) {
    const int saved = errno;
    ::unlink(path.c_str());
    errno = saved;
    throw_error(__FILE__, __LINE__, write_error(path, failed));
  }
}

}  // namespace

KeyPair generate_keypair() {
  init_sodium();
  KeyPair k;
  crypto_sign_keypair(k.public_key.data(), k.secret_key.data());
  return k;
}

PublicKey public_key_of(const SecretKey& key) {
  init_sodium();
  PublicKey out;
  crypto_sign_ed25519_sk_to_pk(out.data(), key.data());
  return out;
}

Signature sign(const SecretKey& key, const std::uint8_t* message, std::size_t size) {
  init_sodium();
  Signature sig;
  crypto_sign_detached(sig.data(), nullptr, message, size, key.data());
  return sig;
}

bool verify_signature(const PublicKey& key, const Signature& sig, const std::uint8_t* message, std::size_t size) {
  init_sodium();
  return crypto_sign_verify_detached(sig.data(), message, size, key.data()) == 0;
}

void check_key_file_writable(const std::string& path, bool replace) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;  // absent: created with O_EXCL
  PULSE_CHECK(!S_ISLNK(st.st_mode), "refusing to write key file " + path + ": it is a symbolic link");
  PULSE_CHECK(S_ISREG(st.st_mode), "refusing to write key file " + path + ": it exists and is not a regular file");
  PULSE_CHECK(replace, "key file " + path + " exists; it is kept (--force replaces it)");
}

void write_key_pair(const std::string& public_path, const std::string& secret_path, const KeyPair& keys, bool replace) {
  check_key_file_writable(secret_path, replace);
  check_key_file_writable(public_path, replace);
  // Both keys are written in full next to their paths before either takes its name, so a
  // failure (an unwritable folder, a full disk) leaves the existing pair as it was.
  const std::string suffix = ".tmp." + std::to_string(::getpid());
  const std::string secret_temp = secret_path + suffix, public_temp = public_path + suffix;
  write_new_file(secret_temp, keys.secret_key.data(), keys.secret_key.size(), 0600);
  try {
    write_new_file(public_temp, keys.public_key.data(), keys.public_key.size(), 0644);
  } catch (const Error&) {
    ::unlink(secret_temp.c_str());
    throw;
  }
  // Without replace a key that appeared meanwhile is kept (RENAME_NOREPLACE).
  auto install = [replace](const std::string& temp, const std::string& path) {
    int rc = ::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, path.c_str(), replace ? 0 : RENAME_NOREPLACE);
    if (rc != 0 && errno == EINVAL && !replace) {  // a filesystem without RENAME_NOREPLACE
      struct stat st {};
      errno = EEXIST;
      rc = ::lstat(path.c_str(), &st) == 0 ? -1 : ::rename(temp.c_str(), path.c_str());
    }
    return rc == 0;
  };
  if (!install(secret_temp, secret_path)) {
    const std::string message = write_error(secret_path, "rename failed");
    ::unlink(secret_temp.c_str());
    ::unlink(public_temp.c_str());
    throw_error(__FILE__, __LINE__, message);
  }
  if (!install(public_temp, public_path)) {
    const std::string message = write_error(public_path, "rename failed; the secret key written is of no use");
    ::unlink(public_temp.c_str());
    throw_error(__FILE__, __LINE__, message);
  }
}

PublicKey read_public_key(const std::string& path) { return read_key<32>(path); }
SecretKey read_secret_key(const std::string& path) {
  const SecretKey key = read_key<64>(path);
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0)  // as ssh warns of a readable private key
    std::fprintf(stderr, "pulse: warning: secret key %s is readable by other users (mode %04o); chmod 600 it\n",
                 path.c_str(), static_cast<unsigned>(st.st_mode & 07777));
  return key;
}

}  // namespace pulse::sync
