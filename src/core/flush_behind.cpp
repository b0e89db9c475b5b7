#include "core/flush_behind.hpp"

#include <fcntl.h>
#include <unistd.h>

namespace pulse {

FlushBehind::FlushBehind(int fd, const std::string& folder)
    : fd_(fd), folder_fd_(::open(folder.empty() ? "." : folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {
  if (folder_fd_ >= 0) thread_ = std::thread([this] { run(); });
}

FlushBehind::~FlushBehind() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  ready_.notify_one();
  if (thread_.joinable()) thread_.join();
  if (folder_fd_ >= 0) ::close(folder_fd_);
}

void FlushBehind::finished(std::uint64_t offset, std::uint64_t size) {
  if (folder_fd_ < 0 || size == 0) return;
  bool enough;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ranges_.emplace_back(offset, size);
    pending_ += size;
    enough = pending_ >= kFlushBytes;
  }
  if (enough) ready_.notify_one();
}

void FlushBehind::run() {
  for (;;) {
    std::deque<std::pair<std::uint64_t, std::uint64_t>> ranges;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ready_.wait(lock, [this] { return stopping_ || pending_ >= kFlushBytes; });
      if (stopping_) return;
      ranges.swap(ranges_);
      pending_ = 0;
    }
    for (const auto& [offset, size] : ranges)
      ::sync_file_range(fd_, off_t(offset), off_t(size),
                        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
    ::fdatasync(folder_fd_);
  }
}

}  // namespace pulse
