// libFuzzer entry: the input is a relay HEAD or anchor record (src/sync/FORMAT.md, "Relay").
// parse_head and parse_anchor_record, without a key and with the fixed key of relay_fuzz_key.hpp,
// must accept it or throw pulse::Error. Beyond crashes and sanitizer reports, the target traps
// when the one-spelling rule breaks: an accepted record must be exactly what the formatter
// writes for the parsed fields (followed by the signature line when signed), and a record
// accepted with the key must be signed.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "relay_fuzz_key.hpp"
#include "sync/relay_record.hpp"

namespace {

using namespace pulse::sync;

const KeyPair& key() {
  static const KeyPair k = pulse_fuzz::relay_fuzz_keypair();
  return k;
}

// The accepted bytes must start with the canonical body; a signed record adds one line of
// "signature " and 128 hex digits.
void check_spelling(const std::string& input, const std::string& body, bool is_signed) {
  if (input.compare(0, body.size(), body) != 0) __builtin_trap();
  const std::size_t rest = input.size() - body.size();
  if (is_signed ? rest != 10 + 128 + 1 : rest != 0) __builtin_trap();
}

template <class Parse, class Format>
void fuzz_one(const std::string& input, Parse parse, Format format) {
  for (const PublicKey* k : {static_cast<const PublicKey*>(nullptr), &key().public_key}) {
    try {
      const auto r = parse(reinterpret_cast<const std::uint8_t*>(input.data()), input.size(), k, "fuzz");
      if (k && !r.is_signed) __builtin_trap();
      check_spelling(input, format(r, nullptr), r.is_signed);
    } catch (const pulse::Error&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  fuzz_one(input, parse_head, format_head);
  fuzz_one(input, parse_anchor_record, format_anchor_record);
  return 0;
}
