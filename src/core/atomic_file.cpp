#include "core/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.hpp"

namespace pulse {

namespace {

std::string reason(const std::string& path, const char* what) {
  return "cannot write " + path + ": " + what + " (" + std::strerror(errno) + ")";
}

}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), temp_path_(path_ + ".tmp.XXXXXX") {
  fd_ = ::mkstemp(temp_path_.data());
  PULSE_CHECK(fd_ >= 0, reason(path_, "no temporary file next to it"));
  ::fchmod(fd_, 0644);  // mkstemp makes 0600; other users' processes read these files
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
}

void AtomicFile::write(const void* data, std::size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, size);
    if (n < 0 && errno == EINTR) continue;
    PULSE_CHECK(n > 0, reason(path_, "write failed"));
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

void AtomicFile::commit() {
  PULSE_CHECK(::fsync(fd_) == 0, reason(path_, "fsync failed"));
  const int rc = ::close(fd_);
  fd_ = -1;
  PULSE_CHECK(rc == 0, reason(path_, "close failed"));
  PULSE_CHECK(::rename(temp_path_.c_str(), path_.c_str()) == 0, reason(path_, "rename failed"));
  committed_ = true;
  const auto slash = path_.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path_.substr(0, slash);
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  PULSE_CHECK(dir_fd >= 0, reason(path_, "cannot open its folder to fsync"));
  const int sync_rc = ::fsync(dir_fd);
  ::close(dir_fd);
  PULSE_CHECK(sync_rc == 0, reason(path_, "fsync of its folder failed"));
}

void write_file_atomically(const std::string& path, const void* data, std::size_t size) {
  AtomicFile file(path);
  file.write(data, size);
  file.commit();
}

}  // namespace pulse
