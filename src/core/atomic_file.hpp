#pragma once
// A file that appears at its path whole or not at all: bytes go to a temporary file in the same
// folder, which commit() fsyncs and renames over the path, then fsyncs the folder so the rename
// survives a crash. Destroyed without commit(), the temporary file is removed and the path keeps
// its old content. Readers therefore never see a partial file. The writer holds an flock on its
// temporary file while it lives, so remove_abandoned_temp_files can tell a killed writer's
// leftover from a live writer's file; each AtomicFile removes those of its own path first, so a
// killed writer's temporary file lasts only until the path is next written.
#include <cstddef>
#include <functional>
#include <string>

namespace pulse {

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, std::size_t size);
  void commit();
  // The temporary file, open read-write, for writers that copy or map into it
  // (sync/file_apply.cpp).
  int fd() const { return fd_; }

 private:
  std::string path_, temp_path_;
  int fd_ = -1;
  bool committed_ = false;
};

// Writes bytes to path atomically (AtomicFile in one call).
void write_file_atomically(const std::string& path, const void* data, std::size_t size);

// Removes the temporary files of AtomicFile writers that died in dir: regular files named
// "<base>.tmp.XXXXXX" (mkstemp's six letters or digits) with is_ours(base) true whose lock no
// process holds. A live writer's file stays. Returns how many were removed; never throws.
int remove_abandoned_temp_files(const std::string& dir, const std::function<bool(const std::string&)>& is_ours);

}  // namespace pulse
