#include "sync/signing.hpp"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
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

void write_key_file(const std::string& path, const std::uint8_t* key, std::size_t size, bool secret, bool replace) {
  check_key_file_writable(path, replace);
  const mode_t mode = secret ? 0600 : 0644;
  if (!replace) return write_new_file(path, key, size, mode);
  // Replacing: the new key appears whole or not at all (a new file, then a rename over path).
  const std::string temp = path + ".tmp." + std::to_string(::getpid());
  write_new_file(temp, key, size, mode);
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const std::string message = write_error(path, "rename failed");
    ::unlink(temp.c_str());
    throw_error(__FILE__, __LINE__, message);
  }
}

PublicKey read_public_key(const std::string& path) { return read_key<32>(path); }
SecretKey read_secret_key(const std::string& path) { return read_key<64>(path); }

}  // namespace pulse::sync
