#pragma once
// The fixed Ed25519 key pair of the relay fuzz target and its seeds: signed seeds verify, so
// mutations start from records that reach every check after the signature.
#include <sodium.h>

#include "coding/signing.hpp"

namespace pulse_fuzz {

inline pulse::sync::KeyPair relay_fuzz_keypair() {
  if (sodium_init() < 0) __builtin_trap();
  unsigned char seed[crypto_sign_SEEDBYTES];
  for (unsigned i = 0; i < sizeof seed; ++i) seed[i] = static_cast<unsigned char>(i * 37 + 11);
  pulse::sync::KeyPair k;
  crypto_sign_seed_keypair(k.public_key.data(), k.secret_key.data(), seed);
  return k;
}

}  // namespace pulse_fuzz
