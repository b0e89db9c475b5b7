#pragma once
// The steps of a resharding receiver (sharded_receiver.hpp) that need no communicator, so that
// any framework's all-reduce can join them (torch.distributed in the Python module, MPI in
// apply_sharded): SlicedApply checks a patch against the layout and this rank's pieces, decodes
// the changes in its pieces and writes them, keeping the old values; its partial sums go through
// a plain integer SUM all-reduce; finish checks the sums against the patch's base and target
// state digests and the layout's element counts, and on a mismatch puts the pieces back.
//
// The partial sums are 32-bit limbs in int64 words, so that any framework's SUM of int64 adds
// them without overflow for fewer than 2^31 ranks: word 0 counts the ranks that refused the
// patch (failed_partial), then per tensor in order of name 10 words: the base digest's sum
// (128 bits, 4 limbs, least significant first), the target digest's (4 limbs) and the elements
// held (2 limbs). finish folds the carries back into sums modulo 2^128.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "shard/piece_sums.hpp"
#include "sync/patch.hpp"
#include "sync/tensor_slice_spec.hpp"

namespace pulse::sync {

// A rank's piece of a tensor, written in place: row by row, row_stride elements apart (0: the
// piece's width; only column pieces take another stride).
struct ReceiverSlice {
  std::string name;
  SliceSpec spec;
  std::byte* data = nullptr;
  std::uint64_t row_stride = 0;
};

class SlicedApply {
 public:
  static constexpr std::size_t kWordsPerTensor = 10;

  // The layout is every tensor of the state (any order, the same on every rank); the parts this
  // rank needs are decoded on `threads` threads (0: the cores). Throws a one-line pulse::Error
  // with nothing written when the patch or the pieces do not fit; else the pieces hold the
  // patch's values and the object their old ones.
  SlicedApply(const ParsedPatch& patch, const std::vector<TensorLayout>& layout,
              const std::vector<ReceiverSlice>& slices, const Metadata& metadata = {}, unsigned threads = 0);
  SlicedApply(const SlicedApply&) = delete;
  SlicedApply& operator=(const SlicedApply&) = delete;

  // This rank's sums, 1 + kWordsPerTensor * tensors words (see the top of this file).
  std::vector<std::int64_t> partial() const;
  // What a rank that refused the patch (its SlicedApply threw) adds to the all-reduce instead.
  static std::vector<std::int64_t> failed_partial(std::size_t tensors);

  // Checks every rank's sums added up; on any mismatch (or a rank that refused) rolls back and
  // throws one line. Afterwards the old values are dropped and rollback is refused.
  void finish(const std::vector<std::int64_t>& summed);
  // Puts this rank's pieces back as they were (for a group that gives up before finish).
  void rollback();

  std::uint64_t written() const { return written_; }  // elements this rank changed
  std::size_t tensors() const { return sorted_.size(); }

 private:
  struct Run {  // elements [begin, end) of a tensor, at data
    std::size_t tensor;
    std::uint64_t begin, end;
    std::byte* data;
  };
  struct Change {  // an element's place and the value to swap in (after the write: its old one)
    std::size_t run;
    std::uint64_t element;  // in the tensor
    std::uint8_t value[8];
  };
  void decode(const ParsedPatch& patch, const std::vector<ReceiverSlice>& slices, unsigned threads);
  void write();
  void swap_in(Change& c);
  void check(const std::vector<PieceSums>& sums) const;

  PatchHeader header_;
  Metadata metadata_;
  std::vector<TensorLayout> sorted_;  // by name
  std::vector<PieceSums> sums_;
  std::vector<Run> runs_;                // by tensor, then begin
  std::vector<std::size_t> first_run_;   // runs of tensor i: [first_run_[i], first_run_[i + 1])
  std::vector<std::vector<Change>> changes_;  // per part
  std::uint64_t written_ = 0;
  bool finished_ = false;
};

}  // namespace pulse::sync
