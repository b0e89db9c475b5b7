#include "io/folder_swap.hpp"

#include <fcntl.h>
#include <stdio.h>  // renameat2 (glibc >= 2.28)
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "core/file_read.hpp"
#include "io/swap_marker.hpp"

namespace pulse::io {
namespace fs = std::filesystem;

namespace {

struct Names {
  fs::path parent, destination;
  std::string name;
  fs::path marker() const { return parent / ("." + name + ".pulse-swap"); }
  fs::path parked_old() const { return parent / ("." + name + ".pulse-old"); }
  std::string new_prefix() const { return "." + name + ".pulse-new."; }
};

Names names_of(const std::string& destination) {
  fs::path d = fs::path(destination).lexically_normal();
  if (d.filename().empty()) d = d.parent_path();  // "dir/" names dir
  PULSE_CHECK(!d.empty() && d.filename() != "." && d.filename() != "..", destination + ": not a folder name to write");
  Names n;
  n.destination = d;
  n.parent = d.has_parent_path() ? d.parent_path() : fs::path(".");
  n.name = d.filename().string();
  return n;
}

[[noreturn]] void fail_errno(const std::string& what) { throw_error(__FILE__, __LINE__, what + ": " + std::strerror(errno)); }

void fsync_path(const fs::path& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) fail_errno("cannot open " + path.string() + " to fsync it");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail_errno("fsync of " + path.string() + " failed");
}

bool exists_no_follow(const fs::path& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0;
}

// A temporary folder whose writer is alive holds an flock on it (released when the process
// dies), so a cleaner never removes a live writer's folder.
bool locked_by_a_live_writer(const fs::path& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool locked = ::flock(fd, LOCK_EX | LOCK_NB) != 0;
  ::close(fd);
  return locked;
}

constexpr std::uint64_t kMaxMarkerBytes = 4096;  // two names and a title

void recover(const Names& n, bool remove_leftovers) {
  std::error_code ec;
  if (exists_no_follow(n.marker())) {
    const auto marker = read_regular_file(n.marker().string(), kMaxMarkerBytes, "folder swap marker");
    // The marker is ours, but checked (plain names, exact spelling) before it steers a removal.
    const auto parsed = parse_swap_marker(std::string(marker.begin(), marker.end()));
    const std::string fresh = parsed ? parsed->fresh : "";
    if (!exists_no_follow(n.destination) && exists_no_follow(n.parked_old())) {
      // Died between the two renames: the old folder goes back.
      if (::rename(n.parked_old().c_str(), n.destination.c_str()) != 0)
        fail_errno("cannot put " + n.parked_old().string() + " back as " + n.destination.string());
      fsync_path(n.parent, true);
    }
    if (exists_no_follow(n.destination)) {
      if (!fresh.empty() && fresh.rfind(n.new_prefix(), 0) == 0) fs::remove_all(n.parent / fresh, ec);
      fs::remove_all(n.parked_old(), ec);
      fs::remove(n.marker(), ec);
      fsync_path(n.parent, true);
    }
  }
  if (!remove_leftovers) return;
  // Temporary folders of killed writers (never a live writer's, never the parked old folder
  // while the destination is missing).
  if (exists_no_follow(n.destination) && !exists_no_follow(n.marker())) fs::remove_all(n.parked_old(), ec);
  for (const auto& entry : fs::directory_iterator(n.parent, ec)) {
    const std::string file = entry.path().filename().string();
    if (file.rfind(n.new_prefix(), 0) == 0 && file.size() == n.new_prefix().size() + 6 &&
        !locked_by_a_live_writer(entry.path()))
      fs::remove_all(entry.path(), ec);
  }
}

// Old -> parked, new -> destination, with the marker first (see the header).
void swap_by_two_renames(const Names& n, const fs::path& fresh) {
  const std::string marker = format_swap_marker({fresh.filename().string(), n.parked_old().filename().string()});
  write_file_atomically(n.marker().string(), marker.data(), marker.size());
  std::error_code ec;
  if (::renameat(AT_FDCWD, n.destination.c_str(), AT_FDCWD, n.parked_old().c_str()) != 0) {
    const int e = errno;
    fs::remove(n.marker(), ec);
    errno = e;
    fail_errno("cannot move " + n.destination.string() + " aside");
  }
  if (::renameat(AT_FDCWD, fresh.c_str(), AT_FDCWD, n.destination.c_str()) != 0) {
    const int e = errno;
    if (::renameat(AT_FDCWD, n.parked_old().c_str(), AT_FDCWD, n.destination.c_str()) == 0) fs::remove(n.marker(), ec);
    errno = e;  // otherwise the marker stays and the next writer puts the old folder back
    fail_errno("cannot move the new folder to " + n.destination.string());
  }
  fsync_path(n.parent, true);
  fs::remove_all(n.parked_old(), ec);
  fs::remove(n.marker(), ec);
}

bool unsupported(int e) { return e == EINVAL || e == ENOSYS || e == ENOTSUP; }

}  // namespace

void sync_folder_tree(const std::string& folder) {
  for (const auto& entry : fs::recursive_directory_iterator(folder)) {
    const bool directory = entry.is_directory() && !entry.is_symlink();
    if (directory || entry.is_regular_file()) fsync_path(entry.path(), directory);
  }
  fsync_path(folder, true);
}

void recover_folder_swap(const std::string& destination) {
  const fs::path d = fs::path(destination).lexically_normal();
  const fs::path name = d.filename().empty() ? d.parent_path().filename() : d.filename();
  if (name.empty() || name == "." || name == "..") return;  // never the destination of a swap
  recover(names_of(destination), false);
}

void replace_folder(const std::string& destination, const std::function<void(const std::string& folder)>& fill) {
  const Names n = names_of(destination);
  recover(n, true);
  struct stat old {};
  const bool replacing = ::lstat(n.destination.c_str(), &old) == 0;
  PULSE_CHECK(!replacing || S_ISDIR(old.st_mode),
              n.destination.string() + " exists and is not a folder; a model folder cannot replace it");
  std::string temp = (n.parent / (n.new_prefix() + "XXXXXX")).string();
  if (::mkdtemp(temp.data()) == nullptr) fail_errno("cannot create a folder next to " + n.destination.string());
  const int lock = ::open(temp.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (lock >= 0) ::flock(lock, LOCK_EX);
  bool swapped = false;
  std::error_code ec;
  try {
    const mode_t mask = ::umask(0);
    ::umask(mask);
    ::chmod(temp.c_str(), replacing ? old.st_mode & 07777 : 0777 & ~mask);  // mkdtemp makes 0700
    fill(temp);
    sync_folder_tree(temp);
    if (!replacing) {
      int rc = ::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, n.destination.c_str(), RENAME_NOREPLACE);
      if (rc != 0 && unsupported(errno)) rc = ::renameat(AT_FDCWD, temp.c_str(), AT_FDCWD, n.destination.c_str());
      if (rc != 0) fail_errno("cannot move the new folder to " + n.destination.string());
      swapped = true;
    } else if (::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, n.destination.c_str(), RENAME_EXCHANGE) == 0) {
      swapped = true;  // temp now holds the old content
    } else {
      if (!unsupported(errno)) fail_errno("cannot swap the new folder with " + n.destination.string());
      swap_by_two_renames(n, temp);
      swapped = true;
    }
    fsync_path(n.parent, true);
  } catch (...) {
    if (!swapped) fs::remove_all(temp, ec);
    if (lock >= 0) ::close(lock);
    throw;
  }
  if (replacing) fs::remove_all(temp, ec);  // the old content
  if (lock >= 0) ::close(lock);
}

}  // namespace pulse::io
