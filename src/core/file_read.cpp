#include "core/file_read.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.hpp"

namespace pulse {

namespace {

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

// A regular file opened without blocking; closed with the object.
struct RegularFile {
  int fd = -1;
  std::uint64_t size = 0;
  RegularFile(const std::string& path, const std::string& name) {
    fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    PULSE_CHECK(fd >= 0, name + "cannot open: " + std::strerror(errno));
    struct stat st {};
    PULSE_CHECK(::fstat(fd, &st) == 0, name + "cannot stat: " + std::strerror(errno));
    PULSE_CHECK(S_ISREG(st.st_mode), name + "not a regular file (" + file_kind(st.st_mode) + ")");
    size = static_cast<std::uint64_t>(st.st_size);
  }
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  ~RegularFile() {
    if (fd >= 0) ::close(fd);
  }

  // Exactly bytes.size() bytes from the current position.
  void read_exactly(std::vector<std::uint8_t>& bytes, const std::string& name) const {
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      PULSE_CHECK(n >= 0, name + "cannot read: " + std::strerror(errno));
      PULSE_CHECK(n > 0, name + "it shrank to " + std::to_string(done) + " bytes while being read");
      done += static_cast<std::size_t>(n);
    }
  }
};

}  // namespace

FilePrefix read_regular_file_prefix(const std::string& path, std::uint64_t prefix_bytes, const std::string& what) {
  const std::string name = what + " '" + path + "': ";
  const RegularFile file(path, name);
  FilePrefix out;
  out.file_size = file.size;
  out.bytes.resize(static_cast<std::size_t>(std::min(prefix_bytes, file.size)));
  file.read_exactly(out.bytes, name);
  return out;
}

std::vector<std::uint8_t> read_regular_file(const std::string& path, std::uint64_t max_bytes, const std::string& what) {
  const std::string name = what + " '" + path + "': ";
  const RegularFile file(path, name);
  const int fd = file.fd;
  const std::uint64_t size = file.size;
  PULSE_CHECK(size <= max_bytes,
              name + std::to_string(size) + " bytes, more than the limit of " + std::to_string(max_bytes));
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(size));
  file.read_exactly(bytes, name);
  std::uint8_t extra;
  ssize_t n;
  while ((n = ::read(fd, &extra, 1)) < 0 && errno == EINTR) {
  }
  PULSE_CHECK(n == 0, name + "it grew while being read");
  return bytes;
}

std::uint64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? std::uint64_t(pages) * std::uint64_t(page) : std::uint64_t(1) << 40;
}

}  // namespace pulse
