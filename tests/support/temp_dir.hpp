#pragma once
// A fresh folder under the system's temporary folder for one test, removed with everything in
// it when the object goes out of scope.
#include <stdlib.h>

#include <filesystem>
#include <string>

namespace pulse::test {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "pulse-test-XXXXXX").string();
    path = ::mkdtemp(t.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

}  // namespace pulse::test
