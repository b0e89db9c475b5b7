// Writes seed inputs for the relay fuzz targets into the folder given as argument: HEADs and
// anchor records, unsigned and signed with relay_fuzz_key.hpp's key, relay file names (valid
// ones and the stray names that once broke retention) and publish.lock texts.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "relay_fuzz_key.hpp"
#include "sync/relay_lock_record.hpp"
#include "sync/relay_record.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s FOLDER\n", argv[0]);
    return 2;
  }
  using namespace pulse::sync;
  const std::string dir = argv[1];
  const KeyPair k = pulse_fuzz::relay_fuzz_keypair();
  Digest d{};
  for (std::size_t i = 0; i < d.size(); ++i) d[i] = static_cast<std::uint8_t>(i * 29 + 3);
  const RelayId relay = "0123456789abcdef0123456789abcdef";
  const RelayHead first{relay, 1, d, d, std::nullopt}, next{relay, 12, d, d, 11}, max{relay, UINT64_MAX, d, d, UINT64_MAX - 1};
  RelayHead old = next;
  old.format = 1;
  const AnchorRecord anchor{relay, 8, d, 4096, 1 << 20};
  AnchorRecord old_anchor = anchor;
  old_anchor.format = 1;
  std::vector<std::pair<std::string, std::string>> seeds = {
      {"head-first", format_head(first, nullptr)},
      {"head-next", format_head(next, nullptr)},
      {"head-signed", format_head(next, &k.secret_key)},
      {"head-max", format_head(max, &k.secret_key)},
      {"head-format1", format_head(old, &k.secret_key)},
      {"anchor", format_anchor_record(anchor, nullptr)},
      {"anchor-signed", format_anchor_record(anchor, &k.secret_key)},
      {"anchor-format1", format_anchor_record(old_anchor, nullptr)},
  };
  const char* names[] = {"HEAD", "publish.lock", "anchor-0.safetensors", "anchor-12.safetensors.zst", "anchor-7.record",
                         "patch-11-12.pulse", "HEAD.tmp.a1B2c3", "anchor-4.safetensors.uncompressed",
                         "anchor-4.safetensors.uncompressed.tmp.abcdef", "publish.lock.tmp.Zz09aa",
                         "anchor--3.safetensors", "anchor-0002.safetensors", "patch-1-2.pulse.bak",
                         "anchor-18446744073709551615.safetensors"};
  int i = 0;
  for (const char* n : names) seeds.push_back({"name-" + std::to_string(i++), n});
  seeds.push_back({"lock", format_lock({"node-17.cluster", 4242, "a1B2c3d4e5F6g7H8"})});
  seeds.push_back({"lock-foreign", "host other\npid 01\nowner me\n"});
  for (const auto& [file, text] : seeds) {
    std::ofstream out(dir + "/" + file, std::ios::binary);
    out << text;
    if (!out) {
      std::fprintf(stderr, "cannot write %s/%s\n", dir.c_str(), file.c_str());
      return 1;
    }
  }
  return 0;
}
