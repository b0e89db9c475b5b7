#include "measure/share_reader.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>

#include "core/error.hpp"
#include "io/model_state.hpp"

namespace pulse::measure {

namespace {

// pread() of byte ranges of a checkpoint's shard files, each opened once.
class ShardFiles {
 public:
  ShardFiles() = default;
  ShardFiles(const ShardFiles&) = delete;
  ShardFiles& operator=(const ShardFiles&) = delete;
  ~ShardFiles() {
    for (const auto& [path, fd] : fds_) ::close(fd);
  }
  void read(const std::string& path, std::uint64_t offset, std::byte* out, std::size_t bytes) {
    auto it = fds_.find(path);
    if (it == fds_.end()) {
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
      it = fds_.emplace(path, fd).first;
    }
    while (bytes > 0) {
      const ssize_t got = ::pread(it->second, out, bytes, off_t(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) throw Error(path + ": cannot read " + std::to_string(bytes) + " bytes at " + std::to_string(offset) +
                                (got < 0 ? std::string(": ") + std::strerror(errno) : std::string(": file shrank")));
      out += got, offset += std::uint64_t(got), bytes -= std::size_t(got);
    }
  }

 private:
  std::map<std::string, int> fds_;
};

}  // namespace

void read_share(const std::string& path, const std::vector<MeasuredTensor>& tensors, const std::vector<Unit>& units,
                std::size_t first, std::size_t last, std::byte* out) {
  const io::ModelState state = io::ModelState::open(path, {}, io::ShardBytes::header_only);
  ShardFiles files;
  // The run of file bytes not read yet: pieces adjacent in one shard file extend it.
  const std::string* run_file = nullptr;
  std::uint64_t run_offset = 0;
  std::size_t run_bytes = 0;
  std::byte* run_out = out;
  for (std::size_t u = first; u < last; ++u)
    for (const Piece& p : units[u].pieces) {
      const MeasuredTensor& t = tensors[p.tensor];
      const io::StateTensor* found = state.find(t.name);
      PULSE_CHECK(found != nullptr, path + ": lacks tensor " + t.name);
      const std::string& file = state.shards()[found->shard].path();
      const std::uint64_t offset = found->file_offset + std::uint64_t(p.begin) * t.element_bytes;
      const std::size_t bytes = std::size_t(p.end - p.begin) * t.element_bytes;
      if (run_file && *run_file == file && run_offset + run_bytes == offset) {
        run_bytes += bytes;
      } else {
        if (run_file) files.read(*run_file, run_offset, run_out, run_bytes);
        run_out += run_bytes;
        run_file = &file, run_offset = offset, run_bytes = bytes;
      }
    }
  if (run_file) files.read(*run_file, run_offset, run_out, run_bytes);
}

}  // namespace pulse::measure
