#pragma once
// Hugging Face safetensors files (https://huggingface.co/docs/safetensors): an 8-byte
// little-endian header length N, N bytes of UTF-8 JSON naming every tensor's dtype, shape and
// byte range in the data section, then the data section. Readers get views into the file read
// into memory; writers publish atomically. Headers are untrusted: every size is
// checked against SafetensorsLimits and the file before it is used.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace pulse::io {

// Every dtype the format defines (safetensors' Dtype enum, 2026). pulse computes on BF16, F16
// and F32; the rest pass through. F4 and F6_* are packed below a byte: a tensor of them holds
// numel x bits / 8 bytes, and numel x bits must be a multiple of 8 (as safetensors requires).
enum class DType {
  BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ,
  I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64
};

const char* dtype_name(DType dtype);
std::size_t dtype_bits(DType dtype);  // bits per element
std::size_t dtype_size(DType dtype);  // bytes per element; throws for the sub-byte dtypes
DType parse_dtype(const std::string& name);  // throws pulse::Error for an unknown name
// Bytes of numel elements into bytes; false when they overflow or do not fill whole bytes.
bool tensor_bytes(DType dtype, std::size_t numel, std::size_t& bytes);

// One tensor of an open file. data points into the map and is not aligned to the element
// type in general (memcpy before reading wider than a byte); it lives as long as the file.
struct TensorView {
  std::string name;
  DType dtype;
  std::vector<std::int64_t> shape;
  const std::byte* data;          // nullptr for a file opened with open_header()
  std::size_t bytes;
  std::uint64_t file_offset = 0;  // where the bytes start in the file
};

struct SafetensorsLimits {
  std::size_t max_header_bytes = 100 << 20;  // Hugging Face refuses headers over 100 MB
  std::size_t max_tensors = 1 << 20;
  std::size_t max_rank = 8;
};

// A validated header: tensors sorted by their byte range, which is [begin, end) relative to
// data_offset; together they cover the data section without holes or overlaps.
struct HeaderEntry {
  std::string name;
  DType dtype;
  std::vector<std::int64_t> shape;
  std::size_t begin;
  std::size_t end;
};
struct ParsedHeader {
  std::size_t data_offset;  // 8 + N: where the data section starts in the file
  std::vector<HeaderEntry> tensors;
  std::map<std::string, std::string> metadata;
};

// Parses and validates the header of a whole file held in memory (file_size bytes from file).
// Every problem throws pulse::Error with one line naming source and the problem.
ParsedHeader parse_header(const std::byte* file, std::size_t file_size, const SafetensorsLimits& limits,
                          const std::string& source = "<memory>");

// A safetensors file read whole into memory, or its header only (regular files only, never mapped: a file truncated
// by someone else while being read is an error, not a SIGBUS). Movable, not copyable; views stay
// valid across moves.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::string& path, const SafetensorsLimits& limits = {});
  // The header only (tensors' data pointers are null; file_offset says where their bytes are),
  // for readers that fetch just the ranges they need: pulse-measure reads each rank's share.
  static SafetensorsFile open_header(const std::string& path, const SafetensorsLimits& limits = {});

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::vector<TensorView>& tensors() const { return tensors_; }  // in data-offset order
  const TensorView* find(const std::string& name) const;             // nullptr when absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

 private:
  SafetensorsFile() = default;
  void set_header(ParsedHeader header, const std::byte* bytes);  // bytes: the whole file, or nullptr

  std::string path_;
  std::vector<std::uint8_t> bytes_;
  std::vector<TensorView> tensors_;
  std::vector<std::size_t> by_name_;  // indices into tensors_ sorted by name, for find()
  std::map<std::string, std::string> metadata_;
};

struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<std::int64_t> shape;
  const void* data;
  std::size_t bytes;  // must equal tensor_bytes(dtype, product(shape))
};

// Writes tensors in the given order (header keys too, "__metadata__" first as Hugging Face
// does), the header padded with spaces to a multiple of 8 bytes. Everything is validated before
// the first byte is written; the file appears atomically (temporary file in the same folder,
// fsync, rename over path, fsync of the folder), so path holds either its old or its new content.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// What write_safetensors writes before the tensors' bytes: the 8-byte header length and the
// header, validated as there (the tensors' data is not read). For writers that stream the
// tensors one at a time (sync/streamed_save.hpp); the file is this, then each tensor's bytes in order.
std::string safetensors_prefix(const std::string& path, const std::vector<TensorToWrite>& tensors,
                               const std::map<std::string, std::string>& metadata = {});

}  // namespace pulse::io
