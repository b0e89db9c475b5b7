#include "core/atomic_file.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <regex>
#include <utility>

#include "core/error.hpp"

namespace pulse {

namespace {

std::string reason(const std::string& path, const char* what) {
  return "cannot write " + path + ": " + what + " (" + std::strerror(errno) + ")";
}

bool same_file(const struct stat& a, const struct stat& b) { return a.st_dev == b.st_dev && a.st_ino == b.st_ino; }

// True while `name` still names the file open as fd.
bool still_named(int fd, const std::string& name) {
  struct stat open_file, named;
  return ::fstat(fd, &open_file) == 0 && ::lstat(name.c_str(), &named) == 0 && same_file(open_file, named);
}

// The folder of path ("." for a bare name) and its last component.
std::pair<std::string, std::string> split_path(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return {".", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  // A writer of this path killed before its commit left a temporary file (as large as the file):
  // the next writer removes it.
  const auto [dir, name] = split_path(path_);
  remove_abandoned_temp_files(dir, [&name = name](const std::string& base) { return base == name; });
  for (;;) {
    temp_path_ = path_ + ".tmp.XXXXXX";
    fd_ = ::mkstemp(temp_path_.data());
    PULSE_CHECK(fd_ >= 0, reason(path_, "no temporary file next to it"));
    // The lock marks the file as a live writer's (released when the process dies). Where the
    // filesystem has no flock, cleaners cannot lock either and remove nothing.
    ::flock(fd_, LOCK_EX);
    // A cleaner may have removed the name between mkstemp and flock: then take a new one.
    if (still_named(fd_, temp_path_)) break;
    ::close(fd_);
  }
  ::fchmod(fd_, 0644);  // mkstemp makes 0600; other users' processes read these files
}

AtomicFile::~AtomicFile() {
  if (!committed_) ::unlink(temp_path_.c_str());  // before close: the lock still guards the name
  if (fd_ >= 0) ::close(fd_);
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
  // Renamed while still open and locked, so no cleaner can take the temporary name first.
  PULSE_CHECK(::rename(temp_path_.c_str(), path_.c_str()) == 0, reason(path_, "rename failed"));
  committed_ = true;
  const int rc = ::close(fd_);
  fd_ = -1;
  PULSE_CHECK(rc == 0, reason(path_, "close failed"));
  const std::string dir = split_path(path_).first;
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

int remove_abandoned_temp_files(const std::string& dir, const std::function<bool(const std::string&)>& is_ours) {
  static const std::regex temp_name("(.+)\\.tmp\\.[A-Za-z0-9]{6}");
  DIR* folder = ::opendir(dir.c_str());
  if (!folder) return 0;
  int removed = 0;
  while (const dirent* entry = ::readdir(folder)) {
    const std::string name = entry->d_name;
    std::smatch m;
    if (!std::regex_match(name, m, temp_name) || !is_ours(m[1].str())) continue;
    const std::string path = dir + "/" + name;
    const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st;
    // Unlinked only while locked by us, so a writer that locks it later sees the name gone.
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ::flock(fd, LOCK_EX | LOCK_NB) == 0 &&
        still_named(fd, path) && ::unlink(path.c_str()) == 0)
      ++removed;
    ::close(fd);
  }
  ::closedir(folder);
  return removed;
}

}  // namespace pulse
