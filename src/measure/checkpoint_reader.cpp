#include "measure/checkpoint_reader.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.hpp"

namespace pulse::measure {

CheckpointReader::CheckpointReader(const std::string& path)
    : path_(path), state_(io::ModelState::open(path, {}, io::ShardBytes::header_only)) {}

CheckpointReader::~CheckpointReader() {
  for (const auto& [shard, f] : files_) {
    if (f.map) ::munmap(const_cast<std::byte*>(f.map), f.bytes);
    ::close(f.fd);
  }
}

CheckpointReader::File& CheckpointReader::file_of(std::size_t shard) {
  auto it = files_.find(shard);
  if (it != files_.end()) return it->second;
  const std::string& name = state_.shards()[shard].path();
  File f;
  f.fd = ::open(name.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // a FIFO put in its place never blocks
  if (f.fd < 0) throw Error(name + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int e = errno;
    ::close(f.fd);
    throw Error(name + (e ? ": cannot stat: " + std::string(std::strerror(e)) : ": not a regular file"));
  }
  f.bytes = std::uint64_t(st.st_size);
  return files_.emplace(shard, f).first->second;
}

const std::byte* CheckpointReader::data(const MeasuredTensor& t, std::int64_t begin, std::int64_t end) {
  const io::StateTensor* found = state_.find(t.name);
  PULSE_CHECK(found != nullptr, path_ + ": lacks tensor " + t.name);
  const std::lock_guard<std::mutex> lock(files_lock_);
  File& f = file_of(found->shard);
  const std::string& name = state_.shards()[found->shard].path();
  const std::uint64_t first = found->file_offset + std::uint64_t(begin) * t.element_bytes;
  const std::uint64_t last = found->file_offset + std::uint64_t(end) * t.element_bytes;
  if (last > f.bytes) throw Error(name + ": holds " + std::to_string(f.bytes) + " bytes, tensor " + t.name + " ends at " +
                                  std::to_string(last) + " (file shrank)");
  if (!f.map) {
    void* m = ::mmap(nullptr, f.bytes, PROT_READ, MAP_SHARED, f.fd, 0);
    if (m == MAP_FAILED) throw Error(name + ": cannot map: " + std::strerror(errno));
    f.map = static_cast<const std::byte*>(m);
  }
  return f.map + first;
}

void CheckpointReader::read_ahead(const std::vector<MeasuredTensor>& tensors, const Unit& unit) {
  for (const Piece& p : unit.pieces) {
    const MeasuredTensor& t = tensors[p.tensor];
    const io::StateTensor* found = state_.find(t.name);
    if (!found) continue;  // data() reports it
    const std::lock_guard<std::mutex> lock(files_lock_);
    const File& f = file_of(found->shard);
    ::posix_fadvise(f.fd, off_t(found->file_offset + std::uint64_t(p.begin) * t.element_bytes),
                    off_t(std::uint64_t(p.end - p.begin) * t.element_bytes), POSIX_FADV_WILLNEED);
  }
}

void CheckpointReader::release(const std::vector<MeasuredTensor>& tensors, const Unit& unit) {
  const std::uint64_t page = std::uint64_t(::sysconf(_SC_PAGESIZE));
  for (const Piece& p : unit.pieces) {
    const MeasuredTensor& t = tensors[p.tensor];
    const io::StateTensor* found = state_.find(t.name);
    if (!found) continue;
    const std::lock_guard<std::mutex> lock(files_lock_);
    const File& f = file_of(found->shard);
    if (!f.map) continue;
    // whole pages only: the pages at the ends may hold a neighbouring unit's elements
    const std::uint64_t first = (found->file_offset + std::uint64_t(p.begin) * t.element_bytes + page - 1) / page * page;
    const std::uint64_t last = (found->file_offset + std::uint64_t(p.end) * t.element_bytes) / page * page;
    if (first < last) ::madvise(const_cast<std::byte*>(f.map) + first, last - first, MADV_DONTNEED);
  }
}

}  // namespace pulse::measure
