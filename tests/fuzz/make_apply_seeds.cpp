// Writes inputs of fuzz_file_apply into the folder given as argument (its input format is in
// fuzz_file_apply.cpp): every coding and compressor with no change, a few changes and many,
// undamaged, and with a byte of the patch or of the base file flipped.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s FOLDER\n", argv[0]);
    return 2;
  }
  int written = 0;
  for (int choice = 0; choice < 30; ++choice)
    for (const int changes : {0, 3, 40})
      for (const int damage : {0, 1, 2}) {  // none, the patch, the base file
        std::vector<std::uint8_t> in{std::uint8_t(choice), std::uint8_t(changes)};
        for (int c = 0; c < changes; ++c)  // tensor, element (2 bytes), step
          in.insert(in.end(), {std::uint8_t(c * 3 + choice), std::uint8_t(c), std::uint8_t(c * 37), std::uint8_t(c % 5 + 1)});
        if (damage)  // odd first byte: the patch
          in.insert(in.end(), {std::uint8_t(damage == 1 ? 1 : 0), std::uint8_t(choice), std::uint8_t(97 * choice), 0x10});
        const std::string path = std::string(argv[1]) + "/apply-" + std::to_string(choice) + "-" +
                                 std::to_string(changes) + "-" + std::to_string(damage);
        std::ofstream out(path, std::ios::binary);
        out.write(reinterpret_cast<const char*>(in.data()), std::streamsize(in.size()));
        if (!out) {
          std::fprintf(stderr, "cannot write %s\n", path.c_str());
          return 1;
        }
        ++written;
      }
  std::printf("%d inputs\n", written);
  return 0;
}
