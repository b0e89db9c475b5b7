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
void write_key_file(const std::string& path, const std::uint8_t* key, std::size_t size);
PublicKey read_public_key(const std::string& path);
SecretKey read_secret_key(const std::string& path);

}  // namespace pulse::sync
