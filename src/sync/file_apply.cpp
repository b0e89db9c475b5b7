#include "sync/file_apply.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <future>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <thread>

#include "core/atomic_file.hpp"
#include "core/element_word.hpp"
#include "core/error.hpp"
#include "coding/parallel.hpp"
#include "core/flush_behind.hpp"
#include "io/folder_swap.hpp"
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

// Writes all of data at offset.
void write_bytes(int fd, const void* data, std::size_t size, std::uint64_t offset, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  for (std::size_t done = 0; done < size;) {
    const ssize_t w = ::pwrite(fd, p + done, size - done, off_t(offset + done));
    if (w < 0 && errno == EINTR) continue;
    PULSE_CHECK(w > 0, io_error(path, "write failed"));
    done += std::size_t(w);
  }
}

struct Mapping {
  void* data = MAP_FAILED;
  std::size_t size = 0;
  // Maps the first bytes of fd read-only (nothing for an empty file); error: what a failure says.
  void map(int fd, std::uint64_t bytes, const std::string& error) {
    if (bytes == 0) return;
    data = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    PULSE_CHECK(data != MAP_FAILED, error);
    size = bytes;
  }
  ~Mapping() {
    if (data != MAP_FAILED) ::munmap(data, size);
  }
};

// The size of the file open as fd, which must be a regular file (named path in the error).
std::uint64_t regular_file_size(int fd, const std::string& path) {
  struct stat st {};
  PULSE_CHECK(::fstat(fd, &st) == 0 && S_ISREG(st.st_mode), path + ": not a regular file");
  return std::uint64_t(st.st_size);
}

// Copies bytes [offset, offset + size) of in to the same place in out: in the kernel where it
// can, else through a buffer.
void copy_bytes(int in, int out, std::uint64_t offset, std::uint64_t size, const std::string& base,
                const std::string& out_path) {
  const std::uint64_t end = offset + size;
  off_t in_offset = off_t(offset), out_offset = off_t(offset);
  bool in_kernel = true;
  std::vector<char> buffer;
  while (std::uint64_t(in_offset) < end) {
    const std::size_t want = std::size_t(std::min<std::uint64_t>(end - std::uint64_t(in_offset), 1u << 30));
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
      if (n > 0) write_bytes(out, buffer.data(), std::size_t(n), std::uint64_t(out_offset), out_path);
      if (n > 0) in_offset += n, out_offset += n;
    }
    if (n < 0 && errno == EINTR) continue;
    PULSE_CHECK(n >= 0, io_error(base, "copy failed"));
    PULSE_CHECK(n > 0, base + ": the file shrank while being copied");
  }
}

// Reads all of bytes [offset, offset + size) of a file into data.
void read_bytes(int fd, void* data, std::size_t size, std::uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(data);
  for (std::size_t got = 0; got < size;) {
    const ssize_t n = ::pread(fd, p + got, size - got, off_t(offset + got));
    if (n < 0 && errno == EINTR) continue;
    PULSE_CHECK(n >= 0, io_error(path, "read failed"));
    PULSE_CHECK(n > 0, path + ": the file shrank while being read");
    got += std::size_t(n);
  }
}

// The digest of bytes [offset, offset + size) of a file, read in pieces.
Digest file_range_digest(int fd, std::uint64_t offset, std::uint64_t size, const std::string& path) {
  std::vector<std::byte> buffer(std::size_t(std::min<std::uint64_t>(size, std::uint64_t(8) << 20)));
  BlockDigest sum;
  for (std::uint64_t at = 0; at < size;) {
    const std::size_t want = std::size_t(std::min<std::uint64_t>(size - at, buffer.size()));
    read_bytes(fd, buffer.data(), want, offset + at, path);  // whole pieces: the blocks are hashed where they lie
    sum.add(buffer.data(), want, at);
    at += want;
  }
  return sum.digest();
}

// Asks the kernel to start writing these bytes to disk now, without waiting: the fsync before
// the rename then finds most of the file written. Advisory: fsync reports any error.
void start_writeback(int fd, std::uint64_t offset, std::uint64_t size) {
  if (size > 0) ::sync_file_range(fd, off_t(offset), off_t(size), SYNC_FILE_RANGE_WRITE);
}

// Runs tasks in the order submitted on `workers` threads; with none, a task runs when submitted.
class WorkQueue {
 public:
  explicit WorkQueue(unsigned workers) {
    for (unsigned i = 0; i < workers; ++i) threads_.emplace_back([this] { run(); });
  }
  ~WorkQueue() {  // runs what is queued, then stops
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_all();
    for (auto& t : threads_) t.join();
  }
  // Waits for a task submitted earlier, running queued tasks meanwhile: on a busy machine a
  // worker may not get a core soon, and the caller would otherwise sit idle.
  template <class Future>
  void wait(Future& done) {
    while (done.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      std::packaged_task<void()> job;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (jobs_.empty()) break;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
    done.get();
  }
  template <class Task>
  std::future<void> submit(Task&& task) {
    std::packaged_task<void()> job(std::forward<Task>(task));
    std::future<void> done = job.get_future();
    if (threads_.empty()) {
      job();
      return done;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back(std::move(job));
    }
    ready_.notify_one();
    return done;
  }

 private:
  void run() {
    for (;;) {
      std::packaged_task<void()> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::packaged_task<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// Waits for every task in flight (helping the queue); the first failure is rethrown unless
// quietly.
void wait_all(WorkQueue& queue, std::deque<std::future<void>>& pending, bool quietly = false) {
  std::exception_ptr first;
  for (; !pending.empty(); pending.pop_front()) try {
      queue.wait(pending.front());
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  if (first && !quietly) std::rethrow_exception(first);
}

// Bytes of a patched tensor go to the file in chunks this size, each started on its way to
// disk as soon as it is written; a chunk is built in pieces small enough to be hashed while in
// cache.
constexpr std::size_t kChunkBytes = std::size_t(4) << 20;
constexpr std::size_t kPieceBytes = std::size_t(128) << 10;
// A changed tensor whose segments are all at most this size (pulse's encoder makes them 32 MiB
// of BF16, 64 MiB of F32) is read from the base a segment at a time into a buffer, decoded
// against it, patched there and written once; a larger one (an older or foreign encoder's) is
// copied whole into the output first, decoded against the copy and written over it.
constexpr std::uint64_t kSegmentBufferBytes = std::uint64_t(64) << 20;

// Buffers lent to one task at a time and kept for the next: a segment is read into memory
// already faulted in.
class BufferPool {
 public:
  class Lease {
   public:
    explicit Lease(BufferPool& pool) : pool_(pool) {
      std::lock_guard<std::mutex> lock(pool_.mutex_);
      if (!pool_.free_.empty()) bytes = std::move(pool_.free_.back()), pool_.free_.pop_back();
    }
    ~Lease() {
      std::lock_guard<std::mutex> lock(pool_.mutex_);
      pool_.free_.push_back(std::move(bytes));
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    std::vector<std::byte> bytes;

   private:
    BufferPool& pool_;
  };

 private:
  std::mutex mutex_;
  std::vector<std::vector<std::byte>> free_;
};

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

namespace {

// A base file copied into its output's temporary file, mapped read-only: what is validated,
// decoded against and hashed is the copy, never the base, which may change meanwhile (only a
// failed apply reads the base again, to say why it failed).
struct FileCopy {
  std::string base, out;
  FileDescriptor in{-1};
  std::unique_ptr<AtomicFile> file;  // removed unless committed
  Mapping map;
  io::ParsedHeader header;
  std::optional<FlushBehind> flush;  // with workers: a thread waits for the disk behind the writers
  bool replaces_base = false;  // in place: the output takes the base's name
  bool linked = false;         // the output is the base, hard-linked (open_link): no file, never written

  const std::byte* bytes() const { return static_cast<const std::byte*>(map.size ? map.data : nullptr); }
  void finished(std::uint64_t offset, std::uint64_t size) {
    if (flush) flush->finished(offset, size);
  }
  // The base's bytes [offset, offset + size) are read. In place their pages leave the cache
  // now, on the threads, rather than all at once when the old file is removed at the end.
  void base_read(std::uint64_t offset, std::uint64_t size) const {
    if (replaces_base) ::posix_fadvise(in.fd, off_t(offset), off_t(size), POSIX_FADV_DONTNEED);
  }
  // The mapped pages of [offset, offset + size) leave this process (their bytes stay in the
  // file and the page cache): a model streams through the map, it never sits in memory.
  void release(std::uint64_t offset, std::uint64_t size) {
    static const std::uint64_t page = std::uint64_t(::sysconf(_SC_PAGESIZE));
    const std::uint64_t begin = offset / page * page, end = std::min<std::uint64_t>(map.size, offset + size);
    if (end > begin) ::madvise(static_cast<char*>(map.data) + begin, end - begin, MADV_DONTNEED);
  }
};

// Allocates the file's blocks (size bytes) before any is written: a full disk fails here, at
// once, not after writing what fits. A filesystem without fallocate allocates as the writes
// come.
void preallocate(int fd, std::uint64_t size, const std::string& path) {
  if (size == 0 || ::fallocate(fd, 0, 0, off_t(size)) == 0) return;
  PULSE_CHECK(errno != ENOSPC && errno != EDQUOT, io_error(path, "no space for the file on its disk"));
}

// Opens base, creates out's temporary file of the same size, maps it, copies the header and
// parses it from the copy.
void open_copy(FileCopy& c, const std::string& base, const std::string& out, unsigned threads) {
  c.base = base;
  c.out = out;
  c.in.fd = ::open(base.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  PULSE_CHECK(c.in.fd >= 0, io_error(base, "cannot open"));
  const std::uint64_t size = regular_file_size(c.in.fd, base);
  c.file = std::make_unique<AtomicFile>(out);
  const int fd = c.file->fd();
  PULSE_CHECK(::ftruncate(fd, off_t(size)) == 0, io_error(out, "cannot size the temporary file"));
  preallocate(fd, size, out);
  c.map.map(fd, size, io_error(out, "cannot map the temporary file"));
  const std::byte* bytes = c.bytes();
  // The header first: its 8-byte length, then as much as that says (the parser checks it).
  const std::uint64_t length_end = std::min<std::uint64_t>(size, 8);
  copy_bytes(c.in.fd, fd, 0, length_end, base, out);
  std::uint64_t n = 0;
  for (std::uint64_t i = 0; i < length_end; ++i) n |= std::uint64_t(bytes[i]) << (8 * i);
  const std::uint64_t header_end = size >= 8 && n <= size - 8 ? 8 + n : size;
  copy_bytes(c.in.fd, fd, length_end, header_end - length_end, base, out);
  c.header = io::parse_header(bytes, size, {}, base);
  start_writeback(fd, 0, c.header.data_offset);
  if (threads > 1) c.flush.emplace(fd, std::filesystem::path(out).parent_path().string());
  c.finished(0, c.header.data_offset);
}

// In place, a shard the patch leaves as it is becomes the new folder's by a hard link: no bytes
// copied or written, and removing the old folder after the swap removes a name, not the data.
// Safe because the shard is never written (pulse replaces files, never writes them in place) and
// after the swap only the new folder names it; a failed apply removes the link, not the shard.
// What is mapped, hashed and verified is the linked file itself. False where base is not a
// regular file (a symlink into the Hugging Face cache's blobs is copied, as before) or the
// filesystem has no hard links: the caller copies it.
bool open_link(FileCopy& c, const std::string& base, const std::string& out) {
  struct stat named {};
  if (::lstat(base.c_str(), &named) != 0 || !S_ISREG(named.st_mode) || ::link(base.c_str(), out.c_str()) != 0)
    return false;
  c.base = base;
  c.out = out;
  c.linked = true;
  c.in.fd = ::open(out.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  PULSE_CHECK(c.in.fd >= 0, io_error(out, "cannot open"));
  const std::uint64_t size = regular_file_size(c.in.fd, out);
  c.map.map(c.in.fd, size, io_error(out, "cannot map"));
  c.header = io::parse_header(c.bytes(), size, {}, base);
  return true;
}

// The names of the tensors of base (a folder's, its files included) that the patch leaves as
// they are: its entries are in name order. None when the counts differ (the decoder says why).
std::set<std::string> unchanged_tensors(const OpenState& base, const ParsedPatch& patch) {
  std::vector<std::string> names;
  for (const auto& t : base.flat.tensors) names.push_back(t.name);
  std::sort(names.begin(), names.end());
  std::set<std::string> unchanged;
  if (names.size() != patch.entries.size()) return unchanged;
  for (std::size_t k = 0; k < names.size(); ++k) {
    const PatchEntry& e = patch.entries[k];
    if (e.kind == EntryKind::same || (e.kind == EntryKind::sparse && e.count == 0)) unchanged.insert(names[k]);
  }
  return unchanged;
}

// Where a tensor of the patched state lies: in a file copy (at offset), or in memory.
struct Slot {
  FileCopy* copy = nullptr;
  std::uint64_t offset = 0;
};

// The copy's tensors (data in its map, in file order), appended to tensors and slots.
void add_tensors(FileCopy& c, std::vector<TensorRef>& tensors, std::vector<Slot>& slots) {
  for (const auto& t : c.header.tensors) {
    const std::uint64_t offset = c.header.data_offset + t.begin;
    tensors.push_back({t.name, io::dtype_name(t.dtype), t.shape, c.bytes() + offset, t.end - t.begin});
    slots.push_back({&c, offset});
  }
}

// Writes `count` new values (width bytes each) at elements indices[k] - first of data. The width
// known as a type: copies of a constant size are moves, not calls.
void put_values(std::byte* data, unsigned width, std::uint64_t first, const std::uint64_t* indices,
                const std::uint8_t* values, std::size_t count) {
  with_element_word(width, "patch values", [&](auto word) {
    constexpr std::size_t W = sizeof(word);
    for (std::size_t k = 0; k < count; ++k) std::memcpy(data + W * (indices[k] - first), values + W * k, W);
  });
}

// Patches bytes [begin, begin + length) of entry e's tensor, held in bytes (the old ones), with
// those of its changes [c, end) that lie there; hashes them into digest and writes them to f at
// offset + begin, in chunks started on their way to disk. Returns the next change.
std::size_t patch_and_write(const DecodedEntry& e, std::size_t c, std::size_t end, std::byte* bytes,
                            std::uint64_t begin, std::size_t length, FileCopy& f, std::uint64_t offset,
                            BlockDigest& digest) {
  for (std::size_t chunk = 0; chunk < length; chunk += kChunkBytes) {
    const std::size_t chunk_length = std::min(length - chunk, kChunkBytes);
    for (std::size_t piece = chunk; piece < chunk + chunk_length; piece += kPieceBytes) {
      const std::size_t piece_length = std::min(chunk + chunk_length - piece, kPieceBytes);
      const std::uint64_t piece_end = begin + piece + piece_length;
      std::size_t last = c;  // the piece's changes: [c, last)
      while (last < end && e.indices[last] * e.width < piece_end) ++last;
      put_values(bytes, e.width, begin / e.width, e.indices.data() + c, e.values.data() + c * e.width, last - c);
      c = last;
      // Hashed and written while in cache. Small writes: on the VM measured (Linux 6.18, ext4),
      // writes of 1 MiB or more into pages not yet in the cache took 3-7x the kernel time of
      // 256 KiB ones.
      digest.add(bytes + piece, piece_length, begin + piece);
      write_bytes(f.file->fd(), bytes + piece, piece_length, offset + begin + piece, f.out);
    }
    start_writeback(f.file->fd(), offset + begin + chunk, chunk_length);
    f.finished(offset + begin + chunk, chunk_length);
  }
  return c;
}

// The pipeline of apply_file over several copies at once (a model folder's shards), and
// tensors held in memory (its other files, written by the caller from *memory_targets).
// tensors and slots: the copies' tensors (data in their maps), then the in-memory ones.
std::uint64_t apply_copies(std::vector<std::unique_ptr<FileCopy>>& copies, const std::vector<TensorRef>& tensors,
                           const std::vector<Slot>& slots, const Metadata& metadata, const ParsedPatch& patch,
                           unsigned threads, double* apply_seconds, std::chrono::steady_clock::time_point t0,
                           std::vector<std::vector<std::byte>>* memory_targets) {
  PatchDecoder decoder(patch, tensors, /*hash_targets=*/false);  // the writers hash what they write
  std::vector<std::size_t> by_name(tensors.size());  // the entries' order
  std::iota(by_name.begin(), by_name.end(), 0);
  std::sort(by_name.begin(), by_name.end(), [&](std::size_t a, std::size_t b) { return tensors[a].name < tensors[b].name; });
  if (memory_targets) memory_targets->assign(tensors.size(), {});
  const std::size_t entries = by_name.size(), parts = decoder.parts();
  std::vector<DecodedEntry> decoded(entries);

  // How each entry in a file reaches the output. Changed, in segments of a bounded size:
  // segment by segment from the base (read, decoded against, patched, written once). Carried
  // whole: written from the patch. Otherwise the tensor is copied in the kernel (ahead of the
  // decoder), then decoded against the copy, and a changed one written over it.
  std::vector<char> by_segment(entries, 0), copied(entries, 0);
  for (std::size_t k = 0; k < entries; ++k) {
    if (!slots[by_name[k]].copy || slots[by_name[k]].copy->linked) continue;
    const PatchEntry& e = patch.entries[k];
    bool bounded = e.kind == EntryKind::sparse && e.count > 0;
    for (const auto& s : decoder.entry_segments(k))
      bounded = bounded && s.elements * sparse_format(tensors[by_name[k]].dtype)->bytes <= kSegmentBufferBytes;
    by_segment[k] = bounded;
    copied[k] = !bounded && e.kind != EntryKind::whole;
  }

  // One verify: the target's digest, from the bytes as written (the decoder, the critical
  // path, only decodes). The base's is hashed only where it is the target's (an unchanged
  // tensor) or when the apply fails, to tell a base that is not the patch's from a corrupt patch.
  std::vector<Digest> base_digests(tensors.size()), target_digests(tensors.size());
  std::vector<char> hashed(tensors.size(), 0);  // the base's digest is known
  std::vector<BlockDigest> segment_sums(entries);  // by_segment entries: their segments' sums so far
  std::mutex segment_sums_mutex;
  auto copy = [&](std::size_t k) {
    const std::size_t t = by_name[k];
    if (const Slot& s = slots[t]; copied[k]) {
      copy_bytes(s.copy->in.fd, s.copy->file->fd(), s.offset, tensors[t].bytes, s.copy->base, s.copy->out);
      s.copy->base_read(s.offset, tensors[t].bytes);
    }
  };
  auto hash_base = [&](std::size_t t) {
    base_digests[t] = tensor_digest(tensors[t]);
    hashed[t] = 1;
  };
  // Once the apply failed: a corrupt patch, or a base that is not the patch's? The base's digest
  // tells which; the tensors not hashed are read again from the base files (their copies may be
  // patched). A base file that changed since cannot tell: the caller's error stands.
  auto check_base = [&] {
    try {
      for (std::size_t t = 0; t < tensors.size(); ++t)
        if (!hashed[t]) {
          const Slot& s = slots[t];
          base_digests[t] = s.copy ? file_range_digest(s.copy->in.fd, s.offset, tensors[t].bytes, s.copy->base)
                                   : tensor_digest(tensors[t]);
        }
    } catch (...) {
      return;
    }
    decoder.check_base(state_digest(tensors, base_digests, metadata));
  };
  // A segment's old bytes, read from the base into buffer.
  auto read_segment = [&](const PatchDecoder::Segment& s, std::vector<std::byte>& buffer) {
    const std::size_t t = by_name[s.entry];
    const unsigned width = sparse_format(tensors[t].dtype)->bytes;
    buffer.resize(std::max<std::size_t>(buffer.size(), s.elements * width));
    const FileCopy& f = *slots[t].copy;
    read_bytes(f.in.fd, buffer.data(), s.elements * width, slots[t].offset + s.begin * width, f.base);
    f.base_read(slots[t].offset + s.begin * width, s.elements * width);
    return buffer.data();
  };
  // A segment decoded against buffer: patched there, hashed and written.
  auto write_segment = [&](const PatchDecoder::Segment& s, std::vector<std::byte>& buffer) {
    const DecodedEntry& e = decoded[s.entry];
    BlockDigest sum;
    patch_and_write(e, s.first_change, s.first_change + s.count, buffer.data(), s.begin * e.width,
                    s.elements * e.width, *slots[e.tensor].copy, slots[e.tensor].offset, sum);
    std::lock_guard<std::mutex> lock(segment_sums_mutex);
    segment_sums[s.entry] += sum;
  };
  // A copied tensor's changes: written over the copy chunk by chunk, each piece hashed as
  // patched while it is in cache.
  auto write_changes = [&](const DecodedEntry& e) {
    const std::size_t t = e.tensor;
    FileCopy& f = *slots[t].copy;
    std::vector<std::byte> chunk(std::size_t(std::min<std::uint64_t>(e.bytes, kChunkBytes)));
    BlockDigest sum;
    std::size_t c = 0;  // the next change
    for (std::uint64_t begin = 0; begin < e.bytes; begin += kChunkBytes) {
      const std::size_t length = std::size_t(std::min<std::uint64_t>(e.bytes - begin, kChunkBytes));
      std::memcpy(chunk.data(), tensors[t].data + begin, length);
      c = patch_and_write(e, c, e.indices.size(), chunk.data(), begin, length, f, slots[t].offset, sum);
    }
    target_digests[t] = sum.digest();
    f.release(slots[t].offset, e.bytes);
  };
  auto write_target = [&](std::size_t k, const DecodedEntry& e) {
    const std::size_t t = e.tensor;
    PULSE_CHECK(!(slots[t].copy && slots[t].copy->linked && e.touched()), "internal: a change to a hard-linked shard");
    if (by_segment[k]) {
      target_digests[t] = segment_sums[k].digest();  // its segments are written
      return;
    }
    if (e.kind == EntryKind::sparse && e.touched()) return write_changes(e);
    FileCopy* f = slots[t].copy;
    const std::uint64_t offset = slots[t].offset;
    if (e.kind == EntryKind::whole) {
      target_digests[t] = tensor_digest({"", "", {}, reinterpret_cast<const std::byte*>(e.whole), e.bytes});
      if (f) {
        write_bytes(f->file->fd(), e.whole, e.bytes, offset, f->out);
      } else {
        const auto* w = reinterpret_cast<const std::byte*>(e.whole);
        (*memory_targets)[t].assign(w, w + e.bytes);
      }
    } else {
      hash_base(t);
      target_digests[t] = base_digests[t];  // the copy is the target
      if (!f) (*memory_targets)[t].assign(tensors[t].data, tensors[t].data + tensors[t].bytes);
    }
    if (f) {
      if (!f->linked) start_writeback(f->file->fd(), offset, e.bytes);
      f->finished(offset, e.bytes);
      f->release(offset, e.bytes);
    }
  };

  // The tasks, in order of entry: copy a tensor (ahead); decode a part once the tensors it lies
  // in are copied (a segment read from the base is written as soon as it is decoded); finish
  // an entry (write a copied tensor's patched bytes, hash them) on the thread that decodes the
  // last part it lies in, or, for an entry in no part, once copied.
  std::unique_ptr<std::atomic<std::size_t>[]> parts_left(new std::atomic<std::size_t>[entries]);
  for (std::size_t k = 0; k < entries; ++k) parts_left[k] = 0;
  std::vector<std::vector<std::size_t>> part_entries(parts);
  std::vector<char> in_parts(entries, 0);
  for (std::size_t p = 0; p < parts; ++p) {
    part_entries[p] = decoder.part_entries(p);
    for (std::size_t k : part_entries[p]) ++parts_left[k], in_parts[k] = 1;
  }
  std::atomic<std::uint64_t> written{0};
  auto write_entry = [&](std::size_t k) {
    DecodedEntry e = std::move(decoded[k]);  // its changes are freed once written
    written += e.kind == EntryKind::whole ? e.bytes : e.indices.size();
    write_target(k, e);
  };
  BufferPool buffers;
  auto decode_part = [&](std::size_t p) {
    BufferPool::Lease buffer(buffers);
    decoder.decode_part(
        p, decoded,
        [&](const PatchDecoder::Segment& s) { return by_segment[s.entry] ? read_segment(s, buffer.bytes) : nullptr; },
        [&](const PatchDecoder::Segment& s) {
          if (by_segment[s.entry]) write_segment(s, buffer.bytes);
        });
  };

  {
    WorkQueue queue(threads - 1);
    std::vector<std::shared_future<void>> copies_done(entries);
    std::deque<std::future<void>> tasks;
    auto copied_entry = [&](std::size_t k) {
      std::shared_future<void> done = copies_done[k];
      queue.wait(done);
    };
    std::size_t next_copy = 0, started = 0, next_part = 0;  // started: entries in parts set up below it
    auto copy_until = [&](std::size_t last) {
      for (; next_copy < entries && next_copy <= last; ++next_copy)
        copies_done[next_copy] = queue.submit([&copy, k = next_copy] { copy(k); }).share();
    };
    try {
      for (std::size_t k = 0; k < entries; ++k) {
        copy_until(k + threads);
        if (!in_parts[k]) {
          decoded[k] = decoder.start(k);
          tasks.push_back(queue.submit([&, k] {
            copied_entry(k);
            write_entry(k);
          }));
        }
        for (; next_part < parts && part_entries[next_part].front() == k; ++next_part) {
          const std::vector<std::size_t>& in = part_entries[next_part];
          copy_until(in.back() + threads);
          for (std::size_t j : in)
            if (j >= started) decoded[j] = decoder.start(j), started = j + 1;
          tasks.push_back(queue.submit([&, p = next_part] {
            for (std::size_t j : part_entries[p]) copied_entry(j);
            decode_part(p);
            for (std::size_t j : part_entries[p])
              if (--parts_left[j] == 0) write_entry(j);
          }));
        }
        // Bounds the decoded changes held: those of the parts and entries in flight.
        for (; tasks.size() > 2 * std::size_t(threads); tasks.pop_front()) queue.wait(tasks.front());
      }
      wait_all(queue, tasks);
      decoder.finish();
    } catch (...) {
      const std::exception_ptr error = std::current_exception();
      wait_all(queue, tasks, true);
      for (auto& done : copies_done)
        if (done.valid()) try {
            queue.wait(done);
          } catch (...) {
          }
      check_base();
      std::rethrow_exception(error);
    }
  }
  if (const Digest target = state_digest(tensors, target_digests, metadata); target != patch.header.target_state) {
    check_base();
    decoder.check_target(target);
  }
  if (apply_seconds) *apply_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Unmapped before the fsync in commit(), which writes what writeback has not yet.
  for (auto& c : copies) {
    if (c->map.data != MAP_FAILED) ::munmap(c->map.data, c->map.size);
    c->map.data = MAP_FAILED;
    c->flush.reset();
  }
  for (auto& c : copies)
    if (c->file) c->file->commit();
  return written;
}

}  // namespace

std::uint64_t apply_file(const std::string& base, const ParsedPatch& patch, const std::string& out, unsigned threads,
                         double* apply_seconds) {
  PULSE_CHECK(threads >= 1, "apply needs at least one thread");
  PULSE_CHECK(!patch.header.changes_layout && !patch.header.changes_metadata,
              "a patch that changes the layout or the metadata cannot be applied file to file");
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<FileCopy>> copies;
  copies.push_back(std::make_unique<FileCopy>());
  FileCopy& c = *copies.back();
  open_copy(c, base, out, threads);
  std::error_code ignored;
  c.replaces_base = std::filesystem::equivalent(base, out, ignored);
  for (const auto& t : c.header.tensors)
    PULSE_CHECK(!is_file_tensor(t.name), base + ": changed while being read (it now carries folder files)");
  std::vector<TensorRef> tensors;  // in file order
  std::vector<Slot> slots;
  add_tensors(c, tensors, slots);
  return apply_copies(copies, tensors, slots, c.header.metadata, patch, threads, apply_seconds, t0, nullptr);
}

bool folder_apply_fits(const OpenState& base, const std::string& out, const ParsedPatch& patch) {
  if (!base.folder() || patch.header.changes_layout || patch.header.changes_metadata) return false;
  // Where save_state would write a folder (sync/checkpoint.hpp).
  struct stat st {};
  const bool exists = ::stat(out.c_str(), &st) == 0;
  if (exists ? !S_ISDIR(st.st_mode) : ends_with(out, ".safetensors") || ends_with(out, ".zst")) return false;
  // The shards keep their names and tensors only while the index stays as it is.
  std::vector<std::string> names;
  for (const auto& t : base.flat.tensors) names.push_back(t.name);
  std::sort(names.begin(), names.end());
  if (names.size() != patch.entries.size()) return false;  // the decoder says why
  for (std::size_t k = 0; k < names.size(); ++k)
    if (is_file_tensor(names[k]) && ends_with(names[k], ".safetensors.index.json") &&
        patch.entries[k].kind != EntryKind::same)
      return false;
  return true;
}

std::uint64_t apply_folder(const OpenState& base, const ParsedPatch& patch, const std::string& out,
                           ReplaceFolder replace, unsigned threads, double* apply_seconds) {
  PULSE_CHECK(threads >= 1, "apply needs at least one thread");
  PULSE_CHECK(base.folder() && !patch.header.changes_layout && !patch.header.changes_metadata,
              "internal: apply_folder takes a folder and a patch that keeps its layout and metadata");
  if (std::filesystem::exists(out)) {
    // The new folder holds the base's shards (same names) and its other files.
    std::set<std::string> written;
    for (const TensorRef& t : base.flat.tensors)
      if (is_file_tensor(t.name)) written.insert(t.name.substr(std::strlen(kFileTensorPrefix)));
    check_replaceable_folder(out, written, replace);
  }
  std::error_code ignored;
  const bool in_place = !base.model.shards().empty() &&
                        std::filesystem::equivalent(std::filesystem::path(base.model.shards().front().path()).parent_path(),
                                                    out, ignored);
  const std::set<std::string> unchanged = in_place ? unchanged_tensors(base, patch) : std::set<std::string>{};
  const auto t0 = std::chrono::steady_clock::now();
  std::uint64_t written = 0;
  io::replace_folder(out, [&](const std::string& folder) {
    std::vector<std::unique_ptr<FileCopy>> copies;
    std::vector<TensorRef> tensors;
    std::vector<Slot> slots;
    for (const io::SafetensorsFile& shard : base.model.shards()) {
      copies.push_back(std::make_unique<FileCopy>());
      FileCopy& c = *copies.back();
      const std::string name = std::filesystem::path(shard.path()).filename().string();
      const std::string shard_out = (std::filesystem::path(folder) / name).string();
      // Not -o: a link would leave two folders sharing a file that a tool writing in place would
      // change in both.
      const bool shard_unchanged = std::all_of(shard.tensors().begin(), shard.tensors().end(),
                                               [&](const io::TensorView& v) { return unchanged.count(v.name) > 0; });
      if (!(in_place && shard_unchanged && open_link(c, shard.path(), shard_out)))
        open_copy(c, shard.path(), shard_out, threads);
      c.replaces_base = in_place;
      // The copy must be the shard that was opened (the folder's layout was checked on it).
      bool same = c.header.metadata == shard.metadata() && c.header.tensors.size() == shard.tensors().size();
      for (std::size_t i = 0; same && i < c.header.tensors.size(); ++i) {
        const io::HeaderEntry& h = c.header.tensors[i];
        const io::TensorView& v = shard.tensors()[i];
        same = h.name == v.name && h.dtype == v.dtype && h.shape == v.shape &&
               c.header.data_offset + h.begin == v.file_offset;
      }
      PULSE_CHECK(same, shard.path() + ": changed while being read (its header is not the one opened)");
      add_tensors(c, tensors, slots);
    }
    // The folder's other files, in memory since the folder was opened.
    const std::size_t first_file = tensors.size();
    for (const TensorRef& t : base.flat.tensors)
      if (is_file_tensor(t.name)) {
        tensors.push_back(t);
        slots.push_back({});
      }
    std::vector<std::vector<std::byte>> files;
    written = apply_copies(copies, tensors, slots, base.flat.metadata, patch, threads, apply_seconds, t0, &files);
    for (std::size_t t = first_file; t < tensors.size(); ++t) {
      const std::string relative = tensors[t].name.substr(std::strlen(kFileTensorPrefix));
      const std::filesystem::path path = std::filesystem::path(folder) / relative;
      std::filesystem::create_directories(path.parent_path());
      write_file_atomically(path.string(), files[t].data(), files[t].size());
    }
  });
  return written;
}

}  // namespace pulse::sync
