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
PublicKey public_key_of(const SecretKey& key);  // the public half a secret key holds
Signature sign(const SecretKey& key, const std::uint8_t* message, std::size_t size);
bool verify_signature(const PublicKey& key, const Signature& sig, const std::uint8_t* message, std::size_t size);

// Key files hold the raw key bytes; reading checks the size and names the file on error.
// Writing a pair writes both files in full under temporary names first (O_EXCL, their final
// modes: 0600 for the secret key, 0644 for the public one), checking every write, fsync and
// close, then renames them into place: a failure leaves existing keys as they were. Symbolic
// links are refused, and existing files are kept unless `replace`; check_key_file_writable
// makes the same checks of one path without writing.
void check_key_file_writable(const std::string& path, bool replace);
void write_key_pair(const std::string& public_path, const std::string& secret_path, const KeyPair& keys, bool replace);
PublicKey read_public_key(const std::string& path);
// Warns on stderr (one line) when others may read the secret key file.
SecretKey read_secret_key(const std::string& path);

}  // namespace pulse::sync
