#include "sync/file_apply.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "io/safetensors.hpp"
#include "sync/model_folder.hpp"

namespace pulse::sync {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string io_error(const std::string& path, const char* what) { return path + ": " + what + " (" + std::strerror(errno) + ")"; }

struct FileDescriptor {
  int fd;
  ~FileDescriptor() {
    if (fd >= 0) ::close(fd);
  }
};

struct Mapping {
  void* data = MAP_FAILED;
  std::size_t size = 0;
  ~Mapping() {
    if (data != MAP_FAILED) ::munmap(data, size);
  }
};

// Copies the first size bytes of in to out: in the kernel where it can, else through a buffer.
void copy_bytes(int in, int out, std::uint64_t size, const std::string& base, const std::string& out_path) {
  off_t in_offset = 0, out_offset = 0;
  bool in_kernel = true;
  std::vector<char> buffer;
  while (std::uint64_t(in_offset) < size) {
    const std::size_t want = std::size_t(std::min<std::uint64_t>(size - std::uint64_t(in_offset), 1u << 30));
    ssize_t n;
    if (in_kernel) {
      n = ::copy_file_range(in, &in_offset, out, &out_offset, want, 0);
      // Not across these filesystems or not at all here: copy the rest through user space.
      if (n < 0 && (errno == EXDEV || errno == ENOSYS || errno == EINVAL || errno == EOPNOTSUPP)) {
        in_kernel = false;
        continue;
      }
    } else {
      buffer.resize(8 << 20);
      n = ::pread(in, buffer.data(), std::min(want, buffer.size()), in_offset);
      for (ssize_t done = 0; n > 0 && done < n;) {
        const ssize_t w = ::pwrite(out, buffer.data() + done, std::size_t(n - done), out_offset + done);
        if (w < 0 && errno == EINTR) continue;
        PULSE_CHECK(w > 0, io_error(out_path, "write failed"));
        done += w;
      }
      if (n > 0) in_offset += n, out_offset += n;
    }
    if (n < 0 && errno == EINTR) continue;
    PULSE_CHECK(n >= 0, io_error(base, "copy failed"));
    PULSE_CHECK(n > 0, base + ": the file shrank while being copied");
  }
}

}  // namespace

bool file_apply_fits(const std::string& base, const std::string& out, const std::vector<TensorRef>& base_layout,
                     const ParsedPatch& patch) {
  struct stat st {};
  if (::stat(base.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || ends_with(base, ".zst")) return false;
  // Where save_state would write a file for a state read from a file (sync/checkpoint.hpp).
  const bool out_is_folder = ::stat(out.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  if (out_is_folder || out.empty() || out.back() == '/' || ends_with(out, ".zst")) return false;
  if (patch.header.changes_layout || patch.header.changes_metadata) return false;
  return std::none_of(base_layout.begin(), base_layout.end(), [](const TensorRef& t) { return is_file_tensor(t.name); });
}

std::uint64_t apply_file(const std::string& base, const ParsedPatch& patch, const std::string& out,
                         double* apply_seconds) {
  const FileDescriptor in{::open(base.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
  PULSE_CHECK(in.fd >= 0, io_error(base, "cannot open"));
  struct stat st {};
  PULSE_CHECK(::fstat(in.fd, &st) == 0 && S_ISREG(st.st_mode), base + ": not a regular file");
  const std::uint64_t size = std::uint64_t(st.st_size);

  AtomicFile file(out);  // removed unless committed
  copy_bytes(in.fd, file.fd(), size, base, out);
  // Everything below reads the copy: what is validated and checked is what gets written.
  Mapping map;
  if (size > 0) {
    map.data = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, file.fd(), 0);
    PULSE_CHECK(map.data != MAP_FAILED, io_error(out, "cannot map the temporary file"));
    map.size = size;
  }
  auto* bytes = static_cast<std::byte*>(size > 0 ? map.data : nullptr);
  const io::ParsedHeader header = io::parse_header(bytes, size, {}, base);
  std::vector<MutableTensor> tensors;
  for (const auto& t : header.tensors) {
    PULSE_CHECK(!is_file_tensor(t.name), base + ": changed while being read (it now carries folder files)");
    tensors.push_back({t.name, io::dtype_name(t.dtype), t.shape, bytes + header.data_offset + t.begin, t.end - t.begin});
  }
  const auto t0 = std::chrono::steady_clock::now();
  // No StateChange: apply_patch refuses a patch that changes the layout or the metadata.
  const std::uint64_t written = apply_patch(patch, tensors, {}, nullptr, nullptr, header.metadata, nullptr);
  if (apply_seconds) *apply_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Unmapped before the fsync in commit(): the dirty pages are the file's page cache, which
  // fsync writes.
  if (map.data != MAP_FAILED) ::munmap(map.data, map.size);
  map.data = MAP_FAILED;
  file.commit();
  return written;
}

}  // namespace pulse::sync
