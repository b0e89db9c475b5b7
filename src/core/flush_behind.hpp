#pragma once
// Makes the bytes a writer has finished durable while it writes the rest, so that the fsync
// before a rename has little left to do. On virtual disks the final fsync's cost is mostly the
// device flushing its write cache (the host's page cache), however early writeback started:
// measured on a 2-core VM, 512 MB written over about a second left 0.6-0.7 s to the fsync, and
// none once each 32 MiB was flushed behind the writer. A thread that only waits for the disk
// does that: for the finished ranges it waits for their writeback, then asks the device to
// flush its cache with a data sync of the file's (clean) folder. fdatasync of the file itself
// would also write its pages still to be overwritten (written twice); a folder's sync writes
// nothing of the file. Advisory: errors are left to the final fsync, which reports them.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace pulse {

class FlushBehind {
 public:
  // fd: the file being written; folder: the folder that holds it.
  FlushBehind(int fd, const std::string& folder);
  ~FlushBehind();  // stops without flushing what is left
  FlushBehind(const FlushBehind&) = delete;
  FlushBehind& operator=(const FlushBehind&) = delete;
  // Bytes [offset, offset + size) of the file hold their final content.
  void finished(std::uint64_t offset, std::uint64_t size);

  static constexpr std::uint64_t kFlushBytes = std::uint64_t(32) << 20;  // flushed together

 private:
  void run();
  int fd_, folder_fd_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::pair<std::uint64_t, std::uint64_t>> ranges_;
  std::uint64_t pending_ = 0;  // bytes in ranges_
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace pulse
