#include "sync/streamed_state.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.hpp"
#include "sync/sparse_format.hpp"

namespace pulse::sync {

std::byte* ByteBuffer::reserve(std::size_t bytes) {
  if (bytes > capacity_) {
    data_.reset();  // the old buffer goes first: never two at once
    capacity_ = 0;
    data_.reset(new std::byte[bytes]);
    capacity_ = bytes;
  }
  return data_.get();
}

StreamedState StreamedState::open(const std::string& path) {
  StreamedState s;
  s.state_ = open_state(path, io::ShardBytes::header_only);
  const auto& shards = s.state_.model.shards();
  for (const auto& shard : shards) {
    const int fd = ::open(shard.path().c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      for (int f : s.fds_) ::close(f);
      throw Error(shard.path() + ": cannot open (" + std::strerror(errno) + ")");
    }
    s.fds_.push_back(fd);
  }
  // flatten() lists the shards' tensors in shard and file order, then the carried files.
  for (std::size_t k = 0; k < shards.size(); ++k)
    for (const auto& t : shards[k].tensors()) s.sources_.push_back({s.fds_[k], t.file_offset, &shards[k].path()});
  s.sources_.resize(s.state_.flat.tensors.size());
  return s;
}

StreamedState::StreamedState(StreamedState&& other) noexcept { *this = std::move(other); }

StreamedState& StreamedState::operator=(StreamedState&& other) noexcept {
  if (this != &other) {
    for (int fd : fds_) ::close(fd);
    state_ = std::move(other.state_);  // the shards move with their paths: sources_ stay valid
    sources_ = std::move(other.sources_);
    fds_ = std::move(other.fds_);
    other.fds_.clear();
  }
  return *this;
}

StreamedState::~StreamedState() {
  for (int fd : fds_) ::close(fd);
}

void StreamedState::read_range(std::size_t i, std::uint64_t offset, std::size_t bytes, std::byte* out) const {
  const Source& s = sources_[i];
  for (std::size_t done = 0; done < bytes;) {
    const ssize_t n = ::pread(s.fd, out + done, bytes - done, off_t(s.offset + offset + done));
    if (n < 0 && errno == EINTR) continue;
    PULSE_CHECK(n >= 0, *s.path + ": read failed (" + std::strerror(errno) + ")");
    PULSE_CHECK(n > 0, *s.path + ": the file shrank while being read (tensor '" + tensors()[i].name + "')");
    done += std::size_t(n);
  }
}

const std::byte* StreamedState::read(std::size_t i, ByteBuffer& buffer) const {
  const TensorRef& t = tensors()[i];
  if (t.data || t.bytes == 0) return t.data;
  std::byte* out = buffer.reserve(t.bytes);
  read_range(i, 0, t.bytes, out);
  return out;
}

void StreamedState::read_into(std::size_t i, std::byte* out) const {
  const TensorRef& t = tensors()[i];
  if (t.data || t.bytes == 0) {
    if (t.bytes) std::memcpy(out, t.data, t.bytes);
    return;
  }
  read_range(i, 0, t.bytes, out);
}

const std::byte* StreamedState::read_piece(std::size_t i, std::uint64_t offset, std::size_t bytes,
                                          ByteBuffer& buffer) const {
  const TensorRef& t = tensors()[i];
  PULSE_CHECK(offset <= t.bytes && bytes <= t.bytes - offset, "internal: a piece beyond tensor '" + t.name + "'");
  if (t.data || t.bytes == 0) return t.data + offset;
  std::byte* out = buffer.reserve(bytes);
  read_range(i, offset, bytes, out);
  return out;
}

Digest StreamedState::digest(std::size_t i) const {
  const TensorRef& t = tensors()[i];
  if (t.data || t.bytes == 0) return tensor_digest(t);
  thread_local ByteBuffer piece;
  BlockDigest sum;  // pieces of whole blocks
  for (std::uint64_t done = 0; done < t.bytes; done += kPieceBytes) {
    const std::size_t n = std::size_t(std::min<std::uint64_t>(kPieceBytes, t.bytes - done));
    sum.add(read_piece(i, done, n, piece), n, done);
  }
  return sum.digest();
}

TensorLoader StreamedState::loader() const {
  return [this](std::size_t i, std::uint64_t offset, std::size_t bytes, std::byte* out) {
    PULSE_CHECK(offset <= tensors()[i].bytes && bytes <= tensors()[i].bytes - offset,
                "internal: a piece beyond tensor '" + tensors()[i].name + "'");
    if (tensors()[i].data) std::memcpy(out, tensors()[i].data + offset, bytes);
    else read_range(i, offset, bytes, out);
  };
}

Digest for_each_piece(const std::vector<TensorRef>& tensors, const TensorLoader& loader, std::size_t i,
                      ByteBuffer& buffer, const std::function<void(const std::byte*, std::size_t)>& piece) {
  const TensorRef& t = tensors[i];
  BlockDigest digest;
  if (t.data || t.bytes == 0) {
    digest.add(t.data, t.bytes, 0);
    piece(t.data, t.bytes);
    return digest.digest();
  }
  PULSE_CHECK(loader, "internal: tensor '" + t.name + "' is neither in memory nor loadable");
  // kPieceBytes is a multiple of the digest block, so each piece adds at a block boundary.
  std::byte* data = buffer.reserve(std::min<std::uint64_t>(t.bytes, StreamedState::kPieceBytes));
  for (std::uint64_t done = 0; done < t.bytes; done += StreamedState::kPieceBytes) {
    const std::size_t n = std::size_t(std::min<std::uint64_t>(StreamedState::kPieceBytes, t.bytes - done));
    loader(i, done, n, data);
    digest.add(data, n, done);
    piece(data, n);
  }
  return digest.digest();
}

std::uint64_t StreamedState::largest_tensor_bytes() const {
  std::uint64_t largest = 0;
  for (const auto& t : tensors()) largest = std::max<std::uint64_t>(largest, t.bytes);
  return largest;
}

void throw_out_of_memory(const std::string& command, std::uint64_t unit_bytes, unsigned copies, const std::string& unit) {
  char text[512];
  std::snprintf(text, sizeof text,
                "%s: out of memory: it needs about %.2f GiB at once (%u x %s, %.2f GiB) plus the "
                "patch; free that much memory (or raise ulimit -v)",
                command.c_str(), double(copies) * double(unit_bytes) / double(1ull << 30), copies, unit.c_str(),
                double(unit_bytes) / double(1ull << 30));
  throw Error(text);
}

std::uint64_t encode_unit_bytes(const std::vector<TensorRef>& state, const EncodeOptions& options) {
  std::uint64_t unit = 0;
  for (const TensorRef& t : state) {
    const auto format = sparse_format(t.dtype);
    const std::uint64_t most = format ? patch_segment_elements(options, format->bytes) * format->bytes
                                      : std::uint64_t(StreamedState::kPieceBytes);
    unit = std::max(unit, std::min<std::uint64_t>(t.bytes, most));
  }
  return unit;
}

}  // namespace pulse::sync
