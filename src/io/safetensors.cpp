#include "io/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "core/file_read.hpp"

namespace pulse::io {

namespace {

// Not ordered_json: its objects insert in linear time, quadratic over a header's entries.
using Json = nlohmann::json;

constexpr std::size_t kLengthBytes = 8;
constexpr const char* kMetadataKey = "__metadata__";

struct DTypeInfo {
  DType dtype;
  const char* name;
  std::size_t bits;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::BOOL, "BOOL", 8},       {DType::F4, "F4", 4},
    {DType::F6_E2M3, "F6_E2M3", 6}, {DType::F6_E3M2, "F6_E3M2", 6},
    {DType::U8, "U8", 8},           {DType::I8, "I8", 8},
    {DType::F8_E5M2, "F8_E5M2", 8}, {DType::F8_E4M3, "F8_E4M3", 8},
    {DType::F8_E8M0, "F8_E8M0", 8}, {DType::F8_E4M3FNUZ, "F8_E4M3FNUZ", 8},
    {DType::F8_E5M2FNUZ, "F8_E5M2FNUZ", 8},
    {DType::I16, "I16", 16},        {DType::U16, "U16", 16},
    {DType::F16, "F16", 16},        {DType::BF16, "BF16", 16},
    {DType::I32, "I32", 32},        {DType::U32, "U32", 32},
    {DType::F32, "F32", 32},        {DType::C64, "C64", 64},
    {DType::F64, "F64", 64},        {DType::I64, "I64", 64},
    {DType::U64, "U64", 64},
};

const DTypeInfo& info(DType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d;
  throw_error(__FILE__, __LINE__, "invalid DType value " + std::to_string(static_cast<int>(dtype)));
}

const DTypeInfo* lookup_dtype(const std::string& name) {
  for (const auto& d : kDTypes)
    if (name == d.name) return &d;
  return nullptr;
}

// Names and parser messages may hold any bytes (newlines, invalid UTF-8): escape them so an
// error stays one printable line, and cut them so a hostile name cannot flood the log.
std::string printable(const std::string& s, std::size_t max_chars = 160) {
  std::string out;
  for (unsigned char c : s) {
    if (out.size() >= max_chars) return out + "...";
    if (c >= 0x20 && c < 0x7F) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    }
  }
  return out;
}

std::string in_quotes(const std::string& s) { return "'" + printable(s) + "'"; }

// a * b, or false when it does not fit in size_t.
bool mul_fits(std::size_t a, std::size_t b, std::size_t& out) {
  if (a != 0 && b > std::numeric_limits<std::size_t>::max() / a) return false;
  out = a * b;
  return true;
}

}  // namespace

const char* dtype_name(DType dtype) { return info(dtype).name; }
std::size_t dtype_bits(DType dtype) { return info(dtype).bits; }
std::size_t dtype_size(DType dtype) {
  PULSE_CHECK(dtype_bits(dtype) % 8 == 0, std::string("dtype ") + dtype_name(dtype) + " is packed below a byte");
  return dtype_bits(dtype) / 8;
}

bool tensor_bytes(DType dtype, std::size_t numel, std::size_t& bytes) {
  std::size_t bits = 0;
  if (!mul_fits(numel, dtype_bits(dtype), bits) || bits % 8 != 0) return false;
  bytes = bits / 8;
  return true;
}

DType parse_dtype(const std::string& name) {
  const DTypeInfo* d = lookup_dtype(name);
  PULSE_CHECK(d, "unknown safetensors dtype " + in_quotes(name));
  return d->dtype;
}

// ---- reading ----

namespace {

// Checks one condition of an untrusted header; the message names the file.
#define HEADER_CHECK(cond, problem) PULSE_CHECK(cond, "safetensors file " + in_quotes(source) + ": " + (problem))

std::map<std::string, std::string> parse_metadata(const Json& value, const std::string& source) {
  std::map<std::string, std::string> out;
  if (value.is_null()) return out;  // Hugging Face reads a null __metadata__ as none
  HEADER_CHECK(value.is_object(), "__metadata__ is not an object");
  for (const auto& [key, v] : value.items()) {
    HEADER_CHECK(v.is_string(), "__metadata__ value of " + in_quotes(key) + " is not a string");
    out.emplace(key, v.get<std::string>());
  }
  return out;
}

std::size_t parse_offset(const Json& v, const std::string& what, const std::string& source) {
  HEADER_CHECK(v.is_number_unsigned(), what + " is not a non-negative integer");
  const auto x = v.get<std::uint64_t>();
  HEADER_CHECK(x <= std::numeric_limits<std::size_t>::max(), what + " is too large");
  return static_cast<std::size_t>(x);
}

HeaderEntry parse_entry(const std::string& name, const Json& value, std::size_t data_bytes,
                        const SafetensorsLimits& limits, const std::string& source) {
  const std::string tensor = "tensor " + in_quotes(name);
  HEADER_CHECK(value.is_object(), tensor + ": entry is not an object");
  // Unknown keys are ignored, as Hugging Face's reader does.
  auto field = [&](const char* key) -> const Json& {
    auto it = value.find(key);
    HEADER_CHECK(it != value.end(), tensor + ": missing \"" + key + "\"");
    return *it;
  };
  HeaderEntry entry{name, DType::U8, {}, 0, 0};

  const Json& dtype = field("dtype");
  HEADER_CHECK(dtype.is_string(), tensor + ": dtype is not a string");
  const DTypeInfo* d = lookup_dtype(dtype.get_ref<const std::string&>());
  HEADER_CHECK(d, tensor + ": unknown dtype " + in_quotes(dtype.get<std::string>()));
  entry.dtype = d->dtype;

  const Json& shape = field("shape");
  HEADER_CHECK(shape.is_array(), tensor + ": shape is not an array");
  HEADER_CHECK(shape.size() <= limits.max_rank, tensor + ": rank " + std::to_string(shape.size()) +
                                                    " exceeds the limit " + std::to_string(limits.max_rank));
  std::size_t numel = 1;
  for (const Json& dim : shape) {
    HEADER_CHECK(!(dim.is_number_integer() && !dim.is_number_unsigned()), tensor + ": negative dimension in shape");
    HEADER_CHECK(dim.is_number_unsigned(), tensor + ": dimension " + printable(dim.dump()) + " is not an integer");
    const auto x = dim.get<std::uint64_t>();
    HEADER_CHECK(x <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
                 tensor + ": dimension " + std::to_string(x) + " is too large");
    HEADER_CHECK(mul_fits(numel, static_cast<std::size_t>(x), numel), tensor + ": shape product overflows");
    entry.shape.push_back(static_cast<std::int64_t>(x));
  }
  std::size_t bytes = 0;
  HEADER_CHECK(mul_fits(numel, d->bits, bytes), tensor + ": shape product overflows");
  HEADER_CHECK(tensor_bytes(d->dtype, numel, bytes),
               tensor + ": " + std::to_string(numel) + " elements of " + d->name + " do not fill whole bytes");

  const Json& offsets = field("data_offsets");
  HEADER_CHECK(offsets.is_array() && offsets.size() == 2, tensor + ": data_offsets is not [begin, end]");
  entry.begin = parse_offset(offsets[0], tensor + ": data_offsets begin", source);
  entry.end = parse_offset(offsets[1], tensor + ": data_offsets end", source);
  const std::string range = "[" + std::to_string(entry.begin) + ", " + std::to_string(entry.end) + "]";
  HEADER_CHECK(entry.begin <= entry.end, tensor + ": data_offsets " + range + " has begin > end");
  HEADER_CHECK(entry.end <= data_bytes, tensor + ": data_offsets " + range + " ends beyond the data section of " +
                                            std::to_string(data_bytes) + " bytes");
  HEADER_CHECK(entry.end - entry.begin == bytes,
               tensor + ": data_offsets " + range + " hold " + std::to_string(entry.end - entry.begin) +
                   " bytes but dtype and shape need " + std::to_string(bytes));
  return entry;
}

// Parses the JSON text and validates each top-level member as soon as it is complete, then
// drops it, so the document never holds more than one entry and entries keep header order.
// Duplicate keys (nlohmann would keep one silently), nesting deeper than the format's (root
// object, entry object, shape array) and too many tensors are rejected while parsing.
void parse_json(const char* text, std::size_t size, std::size_t data_bytes, const SafetensorsLimits& limits,
                const std::string& source, ParsedHeader& out) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::size_t top_level_keys = 0;
  std::string member;  // key of the top-level member being parsed
  auto check = [&](int depth, Json::parse_event_t event, Json& parsed) {
    using E = Json::parse_event_t;
    if (event == E::object_start || event == E::array_start) {
      HEADER_CHECK(depth > 0 || event == E::object_start, "header is not a JSON object");
      HEADER_CHECK(depth <= 2, "header nests deeper than the format allows");
    }
    if (event == E::object_start) keys.emplace_back();
    if (event == E::key) {
      const auto& key = parsed.get_ref<const std::string&>();
      HEADER_CHECK(keys.back().insert(key).second, "duplicate key " + in_quotes(key) + " in header");
      if (depth == 1) {
        HEADER_CHECK(++top_level_keys <= limits.max_tensors + 1,
                     "more than " + std::to_string(limits.max_tensors) + " tensors (the limit)");
        member = key;
      }
    }
    if (event == E::object_end) keys.pop_back();
    const bool member_done = depth == 1 && (event == E::object_end || event == E::array_end || event == E::value);
    if (!member_done) return true;
    if (member == kMetadataKey)
      out.metadata = parse_metadata(parsed, source);
    else
      out.tensors.push_back(parse_entry(member, parsed, data_bytes, limits, source));
    return false;
  };
  Json root;
  try {
    root = Json::parse(text, text + size, check);
  } catch (const Json::exception& e) {
    throw_error(__FILE__, __LINE__,
                "safetensors file " + in_quotes(source) + ": header is not valid UTF-8 JSON: " + printable(e.what(), 400));
  }
  HEADER_CHECK(root.is_object(), "header is not a JSON object");
}

}  // namespace

ParsedHeader parse_header(const std::byte* file, std::size_t file_size, const SafetensorsLimits& limits,
                          const std::string& source) {
  HEADER_CHECK(file_size >= kLengthBytes,
               "file is " + std::to_string(file_size) + " bytes, shorter than the 8-byte header length");
  std::uint64_t n = 0;
  for (std::size_t i = 0; i < kLengthBytes; ++i) n |= std::uint64_t(std::to_integer<unsigned>(file[i])) << (8 * i);
  HEADER_CHECK(n <= limits.max_header_bytes, "header length " + std::to_string(n) + " exceeds the limit of " +
                                                 std::to_string(limits.max_header_bytes) + " bytes");
  HEADER_CHECK(n <= file_size - kLengthBytes, "header length " + std::to_string(n) + " runs past the end of the file (" +
                                                  std::to_string(file_size) + " bytes)");
  ParsedHeader out;
  out.data_offset = kLengthBytes + static_cast<std::size_t>(n);
  const std::size_t data_bytes = file_size - out.data_offset;

  parse_json(reinterpret_cast<const char*>(file) + kLengthBytes, out.data_offset - kLengthBytes, data_bytes, limits,
             source, out);
  HEADER_CHECK(out.tensors.size() <= limits.max_tensors,
               "more than " + std::to_string(limits.max_tensors) + " tensors (the limit)");

  // Like Hugging Face's validator: sorted by range, the tensors must tile the data section.
  // The sort is stable, so empty tensors at one offset keep their header order.
  std::stable_sort(out.tensors.begin(), out.tensors.end(), [](const HeaderEntry& a, const HeaderEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::size_t covered = 0;
  for (std::size_t i = 0; i < out.tensors.size(); ++i) {
    const HeaderEntry& t = out.tensors[i];
    // begin < covered can only happen after a tensor (covered starts at 0).
    HEADER_CHECK(t.begin >= covered, "tensor " + in_quotes(t.name) + " overlaps tensor " + in_quotes(out.tensors[i - 1].name));
    HEADER_CHECK(t.begin == covered, "hole in the data section: bytes [" + std::to_string(covered) + ", " +
                                         std::to_string(t.begin) + ") belong to no tensor");
    covered = t.end;
  }
  HEADER_CHECK(covered == data_bytes, "hole in the data section: its last " + std::to_string(data_bytes - covered) +
                                          " bytes belong to no tensor");
  return out;
}

SafetensorsFile SafetensorsFile::open(const std::string& path, const SafetensorsLimits& limits) {
  // Read, not mapped: a map faults (SIGBUS) when another process truncates the file, where a
  // read can only come up short, which read_regular_file reports as an error. Callers copy or
  // stream the tensors anyway, so the heap copy costs what faulting the map in would.
  SafetensorsFile file;
  file.path_ = path;
  file.bytes_ = read_regular_file(path, physical_memory_bytes(), "safetensors file");
  const auto* bytes = reinterpret_cast<const std::byte*>(file.bytes_.data());
  file.set_header(parse_header(bytes, file.bytes_.size(), limits, path), bytes);
  return file;
}

SafetensorsFile SafetensorsFile::open_header(const std::string& path, const SafetensorsLimits& limits) {
  SafetensorsFile file;
  file.path_ = path;
  const FilePrefix length = read_regular_file_prefix(path, kLengthBytes, "safetensors file");
  std::uint64_t n = 0;
  for (std::size_t i = 0; i < length.bytes.size(); ++i) n |= std::uint64_t(length.bytes[i]) << (8 * i);
  // parse_header reads only the length and the header; the file size bounds the data section.
  const FilePrefix head = read_regular_file_prefix(
      path, kLengthBytes + std::min<std::uint64_t>(n, limits.max_header_bytes + 1), "safetensors file");
  PULSE_CHECK(head.file_size == length.file_size, "safetensors file '" + path + "': it changed size while being read");
  file.set_header(parse_header(reinterpret_cast<const std::byte*>(head.bytes.data()), head.file_size, limits, path),
                  nullptr);
  return file;
}

void SafetensorsFile::set_header(ParsedHeader header, const std::byte* bytes) {
  metadata_ = std::move(header.metadata);
  tensors_.reserve(header.tensors.size());
  for (auto& t : header.tensors)
    tensors_.push_back({std::move(t.name), t.dtype, std::move(t.shape),
                        bytes ? bytes + header.data_offset + t.begin : nullptr, t.end - t.begin,
                        header.data_offset + t.begin});
  by_name_.resize(tensors_.size());
  for (std::size_t i = 0; i < by_name_.size(); ++i) by_name_[i] = i;
  std::sort(by_name_.begin(), by_name_.end(),
            [&](std::size_t a, std::size_t b) { return tensors_[a].name < tensors_[b].name; });
}

const TensorView* SafetensorsFile::find(const std::string& name) const {
  auto it = std::lower_bound(by_name_.begin(), by_name_.end(), name,
                             [&](std::size_t i, const std::string& n) { return tensors_[i].name < n; });
  return it != by_name_.end() && tensors_[*it].name == name ? &tensors_[*it] : nullptr;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept { *this = std::move(other); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    path_ = std::move(other.path_);
    bytes_ = std::move(other.bytes_);  // the buffer moves with its data: views stay valid
    tensors_ = std::move(other.tensors_);
    by_name_ = std::move(other.by_name_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() = default;

#undef HEADER_CHECK

// ---- writing ----

namespace {

#define WRITE_CHECK(cond, problem) PULSE_CHECK(cond, "safetensors file " + in_quotes(path) + ": " + (problem))

// The header text as Hugging Face's writer lays it out: compact JSON, "__metadata__" first,
// each entry as {"dtype", "shape", "data_offsets"}, spaces up to a multiple of 8 bytes. Built
// as text, since no JSON object type keeps insertion order in linear time.
std::string make_header(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  auto json_string = [&](const std::string& s) {
    try {
      return Json(s).dump();
    } catch (const Json::exception&) {
      throw_error(__FILE__, __LINE__, "safetensors file " + in_quotes(path) + ": " + in_quotes(s) + " is not valid UTF-8");
    }
  };
  std::string text = "{";
  if (!metadata.empty()) {
    text += json_string(kMetadataKey) + ":{";
    for (const auto& [k, v] : metadata) text += json_string(k) + ":" + json_string(v) + ",";
    text.back() = '}';
    text += ",";
  }
  std::set<std::string> names;
  std::size_t offset = 0;
  for (const auto& t : tensors) {
    const std::string tensor = "tensor " + in_quotes(t.name);
    WRITE_CHECK(!t.name.empty() && t.name != kMetadataKey, tensor + ": invalid name");
    WRITE_CHECK(names.insert(t.name).second, tensor + ": duplicate name");
    std::size_t numel = 1;
    std::string shape;
    for (std::int64_t d : t.shape) {
      WRITE_CHECK(d >= 0, tensor + ": negative dimension " + std::to_string(d));
      WRITE_CHECK(mul_fits(numel, static_cast<std::size_t>(d), numel), tensor + ": shape product overflows");
      shape += (shape.empty() ? "" : ",") + std::to_string(d);
    }
    std::size_t bytes = 0;
    WRITE_CHECK(tensor_bytes(t.dtype, numel, bytes) && bytes == t.bytes,
                tensor + ": " + std::to_string(t.bytes) + " bytes given, dtype and shape need " +
                    std::to_string(numel) + " x " + std::to_string(dtype_bits(t.dtype)) + " bits");
    text += json_string(t.name) + ":{\"dtype\":\"" + dtype_name(t.dtype) + "\",\"shape\":[" + shape +
            "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + bytes) + "]},";
    offset += bytes;
  }
  if (text.size() > 1) text.pop_back();  // the last comma
  text += "}";
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

std::string safetensors_prefix(const std::string& path, const std::vector<TensorToWrite>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  const std::string header = make_header(path, tensors, metadata);  // validates everything
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[std::size_t(i)] = static_cast<char>(std::uint64_t(header.size()) >> (8 * i));
  return out + header;
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string prefix = safetensors_prefix(path, tensors, metadata);  // validates everything first
  for (const auto& t : tensors)
    WRITE_CHECK(t.data || t.bytes == 0, "tensor " + in_quotes(t.name) + ": no data");
  AtomicFile file(path);
  file.write(prefix.data(), prefix.size());
  for (const auto& t : tensors) file.write(t.data, t.bytes);
  file.commit();
}

#undef WRITE_CHECK

}  // namespace pulse::io
