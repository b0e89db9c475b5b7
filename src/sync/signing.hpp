#pragma once
// Ed25519 signatures (libsodium) so receivers reject patches from anyone but the trainer.
#include <array>
#include <cstdint>
#include <string>

namespace pulse::sync {

using PublicKey = std::array<std::uint8_t, 32>;
using SecretKey = std::array<std::uint8_t, 64>;
using Signature = std::array<std::uint8_t, 64>;

struct KeyPair {
  PublicKey public_key;
  SecretKey secret_key;
};

KeyPair generate_keypair();
Signature sign(const SecretKey& key, const std::uint8_t* message, std::size_t size);
bool verify_signature(const PublicKey& key, const Signature& sig, const std::uint8_t* message, std::size_t size);

// Key files hold the raw key bytes; reading checks the size and names the file on error.
// Writing creates the file with O_EXCL and its final mode (0600 for a secret key, 0644 for a
// public one), refuses symbolic links, checks every write, fsync and close, and keeps an
// existing file unless `replace`; check_key_file_writable makes the same checks without writing.
void check_key_file_writable(const std::string& path, bool replace);
void write_key_file(const std::string& path, const std::uint8_t* key, std::size_t size, bool secret, bool replace);
PublicKey read_public_key(const std::string& path);
SecretKey read_secret_key(const std::string& path);

}  // namespace pulse::sync
