#include "coding/compress.hpp"

#include <lz4.h>
#include <zstd.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>

#include "core/error.hpp"
#include "core/file_read.hpp"

namespace pulse::sync {

Compressor parse_compressor(const std::string& name) {
  if (const auto c = value_named(compressor_names, name)) return *c;
  throw_error(__FILE__, __LINE__, "unknown compressor '" + name + "' (" + names_text(compressor_names) + ")");
}

std::vector<std::uint8_t> compress(Compressor c, int level, const std::vector<std::uint8_t>& raw) {
  if (c == Compressor::none || raw.empty()) return raw;
  std::vector<std::uint8_t> out;
  if (c == Compressor::zstd) {
    // One context per thread, reused: creating one per call costs more than a small stream.
    thread_local std::unique_ptr<ZSTD_CCtx, decltype(&ZSTD_freeCCtx)> context(ZSTD_createCCtx(), ZSTD_freeCCtx);
    PULSE_CHECK(context != nullptr, "zstd: out of memory");
    out.resize(ZSTD_compressBound(raw.size()));
    const std::size_t n = ZSTD_compressCCtx(context.get(), out.data(), out.size(), raw.data(), raw.size(), level);
    PULSE_CHECK(!ZSTD_isError(n), std::string("zstd compression failed: ") + ZSTD_getErrorName(n));
    out.resize(n);
  } else {
    PULSE_CHECK(raw.size() <= std::size_t(LZ4_MAX_INPUT_SIZE), "stream too large for lz4");
    out.resize(LZ4_compressBound(static_cast<int>(raw.size())));
    const int n = LZ4_compress_default(reinterpret_cast<const char*>(raw.data()), reinterpret_cast<char*>(out.data()),
                                       static_cast<int>(raw.size()), static_cast<int>(out.size()));
    PULSE_CHECK(n > 0, "lz4 compression failed");
    out.resize(n);
  }
  return out;
}

std::vector<std::uint8_t> decompress(Compressor c, const std::uint8_t* data, std::size_t size, std::size_t raw_size) {
  if (c == Compressor::none || raw_size == 0) {
    PULSE_CHECK(size == raw_size, "patch stream is " + std::to_string(size) + " bytes, header says " +
                                      std::to_string(raw_size));
    return std::vector<std::uint8_t>(data, data + size);
  }
  std::vector<std::uint8_t> out(raw_size);
  if (c == Compressor::zstd) {
    // Exactly one frame (FORMAT.md "Compression": no second or skippable frame), decoding to
    // exactly raw_size bytes into a buffer of exactly that size.
    const std::size_t frame = ZSTD_findFrameCompressedSize(data, size);
    PULSE_CHECK(!ZSTD_isError(frame) && frame == size, "zstd stream is not exactly one zstd frame");
    const std::size_t n = ZSTD_decompress(out.data(), out.size(), data, size);
    PULSE_CHECK(!ZSTD_isError(n), std::string("corrupt zstd stream: ") + ZSTD_getErrorName(n));
    PULSE_CHECK(n == raw_size, "zstd stream decodes to " + std::to_string(n) + " bytes, header says " +
                                   std::to_string(raw_size));
  } else if (c == Compressor::lz4) {
    PULSE_CHECK(size <= std::size_t(INT_MAX) && raw_size <= std::size_t(INT_MAX), "lz4 stream too large");
    const int n = LZ4_decompress_safe(reinterpret_cast<const char*>(data), reinterpret_cast<char*>(out.data()),
                                      static_cast<int>(size), static_cast<int>(raw_size));
    PULSE_CHECK(n == static_cast<int>(raw_size), "corrupt lz4 stream");
  } else {
    throw_error(__FILE__, __LINE__, "unknown compressor id " + std::to_string(int(c)));
  }
  return out;
}

std::vector<std::uint8_t> decompress_zstd_frame(const std::uint8_t* data, std::size_t size, std::uint64_t max_bytes,
                                                const std::string& source) {
  const unsigned long long declared = ZSTD_getFrameContentSize(data, size);
  PULSE_CHECK(declared != ZSTD_CONTENTSIZE_ERROR && declared != ZSTD_CONTENTSIZE_UNKNOWN,
              source + " is not a zstd frame with a declared size");
  PULSE_CHECK(declared <= max_bytes, source + " declares " + std::to_string(declared) + " bytes, more than the limit of " +
                                         std::to_string(max_bytes));
  const std::size_t frame = ZSTD_findFrameCompressedSize(data, size);
  PULSE_CHECK(!ZSTD_isError(frame) && frame == size, source + " is not exactly one zstd frame");
  std::unique_ptr<ZSTD_DCtx, decltype(&ZSTD_freeDCtx)> ctx(ZSTD_createDCtx(), ZSTD_freeDCtx);
  PULSE_CHECK(ctx, "zstd: out of memory");
  std::vector<std::uint8_t> out;
  ZSTD_inBuffer in{data, size, 0};
  std::size_t produced = 0;
  for (;;) {
    if (produced == out.size() && out.size() < declared)
      out.resize(std::min<std::uint64_t>(declared, std::max<std::uint64_t>(2 * out.size(), 1 << 20)));
    ZSTD_outBuffer o{out.data(), out.size(), produced};
    const std::size_t in_before = in.pos;
    const std::size_t rc = ZSTD_decompressStream(ctx.get(), &o, &in);
    PULSE_CHECK(!ZSTD_isError(rc), source + ": corrupt zstd frame (" + ZSTD_getErrorName(rc) + ")");
    const bool progressed = in.pos != in_before || o.pos != produced;
    produced = o.pos;
    if (rc == 0) break;
    PULSE_CHECK(progressed, source + ": the zstd frame stops after " + std::to_string(produced) + " of the " +
                                std::to_string(declared) + " bytes it declares, or runs past them");
  }
  PULSE_CHECK(produced == declared, source + " decodes to " + std::to_string(produced) + " bytes, it declares " +
                                        std::to_string(declared));
  out.resize(produced);
  return out;
}

struct ZstdFrameWriter::Context {
  std::unique_ptr<ZSTD_CCtx, decltype(&ZSTD_freeCCtx)> cctx{ZSTD_createCCtx(), ZSTD_freeCCtx};
  std::vector<std::uint8_t> buffer = std::vector<std::uint8_t>(ZSTD_CStreamOutSize());
};

ZstdFrameWriter::ZstdFrameWriter(int level, std::uint64_t content_bytes, ByteSink out)
    : context_(std::make_unique<Context>()), content_bytes_(content_bytes), out_(std::move(out)) {
  ZSTD_CCtx* c = context_->cctx.get();
  PULSE_CHECK(c, "zstd: out of memory");
  PULSE_CHECK(!ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, level)) &&
                  !ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 1)) &&
                  !ZSTD_isError(ZSTD_CCtx_setPledgedSrcSize(c, content_bytes)),
              "zstd: cannot set up a stream at level " + std::to_string(level));
}

ZstdFrameWriter::~ZstdFrameWriter() = default;

void ZstdFrameWriter::pump(const void* data, std::size_t size, bool end) {
  ZSTD_inBuffer in{data, size, 0};
  for (;;) {
    ZSTD_outBuffer o{context_->buffer.data(), context_->buffer.size(), 0};
    const std::size_t left = ZSTD_compressStream2(context_->cctx.get(), &o, &in, end ? ZSTD_e_end : ZSTD_e_continue);
    PULSE_CHECK(!ZSTD_isError(left), std::string("zstd compression failed: ") + ZSTD_getErrorName(left));
    if (o.pos) out_(o.dst, o.pos);
    if (end ? left == 0 : in.pos == in.size) return;
  }
}

void ZstdFrameWriter::write(const void* data, std::size_t size) {
  PULSE_CHECK(size <= content_bytes_ - written_, "internal: more bytes than the zstd frame declares");
  written_ += size;
  if (size) pump(data, size, false);
}

void ZstdFrameWriter::finish() {
  PULSE_CHECK(written_ == content_bytes_, "internal: fewer bytes than the zstd frame declares");
  pump(nullptr, 0, true);
}

std::uint64_t decompress_zstd_file(const std::string& path, std::uint64_t max_bytes, const ByteSink& out) {
  // The frame header first (at most 18 bytes, zstd's ZSTD_FRAMEHEADERSIZE_MAX): the declared size, before
  // anything is decoded. read_regular_file_prefix refuses what is not a regular file.
  const FilePrefix head = read_regular_file_prefix(path, 18, "compressed checkpoint");
  const unsigned long long declared = ZSTD_getFrameContentSize(head.bytes.data(), head.bytes.size());
  PULSE_CHECK(declared != ZSTD_CONTENTSIZE_ERROR && declared != ZSTD_CONTENTSIZE_UNKNOWN,
              path + " is not a zstd frame with a declared size");
  PULSE_CHECK(declared <= max_bytes, path + " declares " + std::to_string(declared) + " bytes, more than the limit of " +
                                         std::to_string(max_bytes));
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
  PULSE_CHECK(fd >= 0, path + ": cannot open (" + std::strerror(errno) + ")");
  std::unique_ptr<int, void (*)(int*)> closer(new int(fd), [](int* f) { ::close(*f); delete f; });
  std::unique_ptr<ZSTD_DCtx, decltype(&ZSTD_freeDCtx)> ctx(ZSTD_createDCtx(), ZSTD_freeDCtx);
  PULSE_CHECK(ctx, "zstd: out of memory");
  std::vector<std::uint8_t> input(ZSTD_DStreamInSize()), output(ZSTD_DStreamOutSize());
  std::uint64_t offset = 0, produced = 0;
  bool ended = false;
  for (;;) {
    ssize_t n = ::pread(fd, input.data(), input.size(), off_t(offset));
    if (n < 0 && errno == EINTR) continue;
    PULSE_CHECK(n >= 0, path + ": read failed (" + std::strerror(errno) + ")");
    if (n == 0) break;
    offset += std::uint64_t(n);
    PULSE_CHECK(!ended, path + " is not exactly one zstd frame (bytes follow it)");
    ZSTD_inBuffer in{input.data(), std::size_t(n), 0};
    bool full = false;  // a full output may leave decoded bytes inside zstd: call again
    while (in.pos < in.size || full) {
      ZSTD_outBuffer o{output.data(), output.size(), 0};
      const std::size_t rc = ZSTD_decompressStream(ctx.get(), &o, &in);
      PULSE_CHECK(!ZSTD_isError(rc), path + ": corrupt zstd frame (" + ZSTD_getErrorName(rc) + ")");
      produced += o.pos;
      PULSE_CHECK(produced <= declared, path + ": the zstd frame runs past the " + std::to_string(declared) +
                                            " bytes it declares");
      if (o.pos) out(o.dst, o.pos);
      full = o.pos == o.size;
      if (rc == 0) {
        ended = true;
        PULSE_CHECK(in.pos == in.size, path + " is not exactly one zstd frame (bytes follow it)");
        break;
      }
    }
  }
  PULSE_CHECK(ended, path + ": the zstd frame stops after " + std::to_string(produced) + " of the " +
                         std::to_string(declared) + " bytes it declares");
  PULSE_CHECK(produced == declared, path + " decodes to " + std::to_string(produced) + " bytes, it declares " +
                                        std::to_string(declared));
  return produced;
}

}  // namespace pulse::sync
