#pragma once
// Makes the bytes a writer has finished durable while it writes the rest, so that the fsync
// before a rename has little left to do. On the virtual disk measured (a 2-core VM), the final
// fsync's cost is mostly the device flushing its write cache, however early the writeback
// started: a writer pacing 512 MB over about 1.3 s, with writeback started per 4 MiB, left
// 0.2-0.7 s to the final fsync, and 0.00-0.04 s when each 32 MiB was flushed behind it (waiting
// for the ranges' writeback alone left 0.75 s). A thread that only waits for the disk does
// that: for the finished ranges it waits for their writeback, then has the device flush its
// cache with a data sync of the file's folder, which need not write the file's other dirty
// pages (ext4 commits its journal and flushes the device; a filesystem that does not flush
// there only loses the gain). A data sync of the file itself would also write its pages still
// to be overwritten: twice the bytes. Advisory: errors are left to the final fsync, which
// reports them.
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
