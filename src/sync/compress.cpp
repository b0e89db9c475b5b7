#include "sync/compress.hpp"

#include <lz4.h>
#include <zstd.h>

#include <algorithm>
#include <climits>
#include <memory>

#include "core/error.hpp"

namespace pulse::sync {

const char* compressor_name(Compressor c) {
  switch (c) {
    case Compressor::none: return "none";
    case Compressor::zstd: return "zstd";
    case Compressor::lz4: return "lz4";
  }
  return "unknown";
}

Compressor parse_compressor(const std::string& name) {
  if (name == "none") return Compressor::none;
  if (name == "zstd") return Compressor::zstd;
  if (name == "lz4") return Compressor::lz4;
  throw_error(__FILE__, __LINE__, "unknown compressor '" + name + "' (none, zstd, lz4)");
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

}  // namespace pulse::sync
