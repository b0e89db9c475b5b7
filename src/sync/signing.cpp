#include "sync/signing.hpp"

#include <sodium.h>
#include <sys/stat.h>

#include <fstream>
#include <iterator>
#include <vector>

#include "core/error.hpp"

namespace pulse::sync {

namespace {

void init_sodium() { PULSE_CHECK(sodium_init() >= 0, "libsodium failed to initialise"); }

template <std::size_t N>
std::array<std::uint8_t, N> read_key(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  PULSE_CHECK(in, "cannot read key file " + path);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  PULSE_CHECK(bytes.size() == N, "key file " + path + " holds " + std::to_string(bytes.size()) + " bytes, expected " +
                                     std::to_string(N));
  std::array<std::uint8_t, N> key;
  std::copy(bytes.begin(), bytes.end(), key.begin());
  return key;
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

void write_key_file(const std::string& path, const std::uint8_t* key, std::size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(key), static_cast<std::streamsize>(size));
  PULSE_CHECK(out, "cannot write key file " + path);
  out.close();
  ::chmod(path.c_str(), 0600);
}

PublicKey read_public_key(const std::string& path) { return read_key<32>(path); }
SecretKey read_secret_key(const std::string& path) { return read_key<64>(path); }

}  // namespace pulse::sync
