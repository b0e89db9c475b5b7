#pragma once
// What pulse-sync inspect and diff print with --json and what pulse.inspect and pulse.diff return
// in Python: one computation each, one JSON shape (docs/pulse-sync.md, "inspect and diff").
//   describe_patch: a patch's header, coding, stream sizes, entry kinds, per-dtype summary and
//                   layout change.
//   diff_states:    per tensor and per dtype, how many elements differ between two states.
#include <cstdint>
#include <string>
#include <vector>

#include "coding/digest.hpp"
#include "sync/patch.hpp"

namespace pulse::sync {

class StreamedState;

// 100 * (1 - changed / elements); 100 for no elements.
double sparsity_percent(std::uint64_t changed, std::uint64_t elements);

// A parsed patch as one JSON object (keys: format_version, bytes, signed, base_version,
// target_version, base_state, target_state, values, indices, compressor, streams, table_bytes,
// entries, total_changed, summary, removed, added, and metadata when the patch changes it).
std::string describe_patch(const ParsedPatch& patch);

// One tensor of the later state B (or one that B dropped) against the earlier state A.
struct TensorDiff {
  enum class Status { compared, added, removed, redeclared };  // redeclared: same name, other dtype or shape
  std::string name, dtype;
  Status status = Status::compared;
  bool differs = false;
  // Elements are compared one by one, except in dtypes packed below a byte (only `differs`).
  bool element_wise = true;
  std::uint64_t elements = 0, changed = 0;
};
struct DtypeDiff {
  std::string dtype;
  bool element_wise = true;
  std::uint64_t elements = 0, changed = 0, differing_tensors = 0;
};
struct StateDiff {
  std::vector<TensorDiff> tensors;  // those B dropped, in A's order, then B's in order
  std::vector<DtypeDiff> totals;    // over the compared tensors, by dtype name
  bool metadata_changed = false;
};

// Tensors compared on `threads` threads (0: the cores), a piece of each state in memory at a
// time for streamed states; the result does not depend on the thread count.
StateDiff diff_states(const StreamedState& a, const StreamedState& b, unsigned threads);
// States in memory (every TensorRef's data set).
StateDiff diff_states(const std::vector<TensorRef>& a, const std::vector<TensorRef>& b, const Metadata& a_metadata,
                      const Metadata& b_metadata, unsigned threads);

// As one JSON object: tensors (name, dtype, then elements, changed, sparsity_percent; or differs
// for packed dtypes; or status "added", "removed", "re-declared"), totals by dtype (elements,
// changed, sparsity_percent; or differing_tensors), metadata_changed.
std::string diff_json(const StateDiff& diff);

}  // namespace pulse::sync
