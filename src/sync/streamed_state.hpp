#pragma once
// A model state (a .safetensors file or a model folder, in flat form: sync/model_folder.hpp)
// whose shard tensors are read from their files one at a time, when asked, never all at once:
// pulse-sync's encode holds a segment of each state per thread and the patch, diff and verify
// 8 MiB pieces per thread, not the model. Only the headers and the folder's other files (config, tokenizer, index) are read at open.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sync/checkpoint.hpp"
#include "sync/patch.hpp"

namespace pulse::sync {

// A growing byte buffer that is not zeroed (a tensor read into it overwrites every byte).
class ByteBuffer {
 public:
  std::byte* reserve(std::size_t bytes);
 private:
  std::unique_ptr<std::byte[]> data_;
  std::size_t capacity_ = 0;
};

class StreamedState {
 public:
  // Puts back a folder left missing by an interrupted swap first, as open_state does.
  static StreamedState open(const std::string& path);
  StreamedState(StreamedState&&) noexcept;
  StreamedState& operator=(StreamedState&&) noexcept;
  ~StreamedState();

  // The flat state: shard tensors with data null (read them with read()), carried files in memory.
  const std::vector<TensorRef>& tensors() const { return state_.flat.tensors; }
  const Metadata& metadata() const { return state_.flat.metadata; }
  bool folder() const { return state_.folder(); }
  const std::string& path() const { return state_.model.path(); }

  // The bytes of tensors()[i]: where they lie in memory, or read from the file into buffer.
  // A file that comes up short (changed since it was opened) throws pulse::Error.
  const std::byte* read(std::size_t i, ByteBuffer& buffer) const;
  // Reads all of tensors()[i] into out (tensors()[i].bytes bytes).
  void read_into(std::size_t i, std::byte* out) const;
  // Bytes [offset, offset + bytes) of tensors()[i], the same way.
  const std::byte* read_piece(std::size_t i, std::uint64_t offset, std::size_t bytes, ByteBuffer& buffer) const;
  // The digest of tensors()[i], read in pieces (a bounded buffer, whatever the tensor's size).
  Digest digest(std::size_t i) const;
  // What read_piece's callers read at a time: 8 MiB, a multiple of every element width.
  static constexpr std::size_t kPieceBytes = std::size_t(8) << 20;
  // A loader for encode_patch (pread: any thread, any piece).
  TensorLoader loader() const;
  // The largest tensor, in bytes (what a streamed command holds of a state at once).
  std::uint64_t largest_tensor_bytes() const;

 private:
  StreamedState() = default;
  void read_range(std::size_t i, std::uint64_t offset, std::size_t bytes, std::byte* out) const;
  OpenState state_;
  struct Source {
    int fd = -1;  // the shard's file, or -1 when the bytes are in memory
    std::uint64_t offset = 0;
    const std::string* path = nullptr;
  };
  std::vector<Source> sources_;  // one per tensor
  std::vector<int> fds_;         // one per shard
};

// Passes tensors[i]'s bytes to piece(data, bytes) in order: at once when in memory, else read
// through the loader in StreamedState::kPieceBytes pieces into buffer. Returns their digest.
Digest for_each_piece(const std::vector<TensorRef>& tensors, const TensorLoader& loader, std::size_t i,
                      ByteBuffer& buffer, const std::function<void(const std::byte*, std::size_t)>& piece);

// When a streamed command cannot get the memory it needs: one line saying how much (need, `unit`
// bytes `copies` times plus the patch; unit: "the largest tensor", or what it names) and the way out.
[[noreturn]] void throw_out_of_memory(const std::string& command, std::uint64_t unit_bytes, unsigned copies,
                                      const std::string& unit = "the largest tensor");
// What encode_patch holds of streamed states per thread: the larger of a segment
// (options.part_elements elements, of the widest sparse dtype it meets) and a piece of a tensor
// not coded sparsely, or the tensor itself when smaller. It holds two of them (one of each
// state) per thread.
std::uint64_t encode_unit_bytes(const std::vector<TensorRef>& state, const EncodeOptions& options);

}  // namespace pulse::sync
