#pragma once
// xxh3-128 digests of tensors and of a whole model state. The state digest is canonical: it
// covers every tensor's name, dtype, shape and bytes, in order of name, so two files with the
// same tensors in another layout have the same digest.
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace pulse::sync {

using Digest = std::array<std::uint8_t, 16>;

Digest digest_bytes(const void* data, std::size_t bytes);

// digest_bytes of bytes that arrive in pieces: the pieces' concatenation.
class DigestStream {
 public:
  DigestStream();
  ~DigestStream();
  DigestStream(const DigestStream&) = delete;
  DigestStream& operator=(const DigestStream&) = delete;
  void update(const void* data, std::size_t bytes);
  Digest finish() const;

 private:
  void* state_;  // an XXH3_state_t
};
std::string to_hex(const Digest& d);
// Parses 32 hex digits; throws pulse::Error otherwise.
Digest digest_from_hex(const std::string& hex);

// One tensor of a model state, as its bytes (any safetensors dtype).
struct TensorRef {
  std::string name;
  std::string dtype;  // safetensors dtype name: "BF16", "F32", ...
  std::vector<std::int64_t> shape;
  const std::byte* data = nullptr;
  std::size_t bytes = 0;
};

// Digest of the tensor's bytes (the per-tensor digest a patch records).
inline Digest tensor_digest(const TensorRef& t) { return digest_bytes(t.data, t.bytes); }

// Canonical digest of a state from its tensors' names, dtypes, shapes and per-tensor digests,
// and its `__metadata__` (key, value pairs); an empty metadata adds nothing.
Digest state_digest(const std::vector<TensorRef>& tensors, const std::vector<Digest>& tensor_digests,
                    const std::map<std::string, std::string>& metadata = {});
Digest state_digest(const std::vector<TensorRef>& tensors, const std::map<std::string, std::string>& metadata = {});

// Digest of a layout: the tensors' names, dtypes and shapes in order of name, no contents.
Digest layout_digest(const std::vector<TensorRef>& tensors);

}  // namespace pulse::sync
