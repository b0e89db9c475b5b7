#include "measure/checkpoint_reader.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.hpp"

namespace pulse::measure {

CheckpointReader::CheckpointReader(const std::string& path)
    : path_(path), state_(io::ModelState::open(path, {}, io::ShardBytes::header_only)) {}

CheckpointReader::~CheckpointReader() {
  for (const auto& [shard, fd] : fds_) ::close(fd);
}

CheckpointReader::Location CheckpointReader::locate(const MeasuredTensor& t, std::int64_t begin) {
  const io::StateTensor* found = state_.find(t.name);
  PULSE_CHECK(found != nullptr, path_ + ": lacks tensor " + t.name);
  auto it = fds_.find(found->shard);
  if (it == fds_.end()) {
    const std::string& file = state_.shards()[found->shard].path();
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error(file + ": cannot open: " + std::strerror(errno));
    it = fds_.emplace(found->shard, fd).first;
  }
  return {it->second, found->file_offset + std::uint64_t(begin) * t.element_bytes};
}

void CheckpointReader::read(const MeasuredTensor& t, std::int64_t begin, std::int64_t end, std::byte* out) {
  Location at = locate(t, begin);
  std::size_t bytes = std::size_t(end - begin) * t.element_bytes;
  while (bytes > 0) {
    const ssize_t got = ::pread(at.fd, out, bytes, off_t(at.offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      const std::string& file = state_.shards()[state_.find(t.name)->shard].path();
      throw Error(file + ": cannot read " + std::to_string(bytes) + " bytes at " + std::to_string(at.offset) +
                  (got < 0 ? std::string(": ") + std::strerror(errno) : std::string(": file shrank")));
    }
    out += got, at.offset += std::uint64_t(got), bytes -= std::size_t(got);
  }
}

void CheckpointReader::read_ahead(const std::vector<MeasuredTensor>& tensors, const std::vector<Unit>& units,
                                  std::size_t first, std::size_t last) {
  for (std::size_t u = first; u < last; ++u)
    for (const Piece& p : units[u].pieces) {
      const MeasuredTensor& t = tensors[p.tensor];
      const Location at = locate(t, p.begin);
      ::posix_fadvise(at.fd, off_t(at.offset), off_t(std::uint64_t(p.end - p.begin) * t.element_bytes),
                      POSIX_FADV_WILLNEED);
    }
}

}  // namespace pulse::measure
