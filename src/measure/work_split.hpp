#pragma once
// How pulse-measure splits a model among ranks: tensors (in the order given) are cut into pieces of
// at most unit_bytes, pieces are grouped into units of about unit_bytes, and each rank takes a
// contiguous run of units holding about 1/nranks of the bytes. Units do not depend on the rank
// count, so the per-unit patch sizes (and every dataset) are the same at any np.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pulse::measure {

struct MeasuredTensor {
  std::string name;
  std::string dtype;  // "BF16", "F16" or "F32"
  std::vector<std::int64_t> shape;
  std::int64_t numel = 0;
  std::size_t element_bytes = 0;
};

struct Piece {
  std::size_t tensor;        // index into the measured tensors
  std::int64_t begin, end;   // element range [begin, end)
};

struct Unit {
  std::vector<Piece> pieces;
  std::uint64_t bytes = 0;
};

std::vector<Unit> make_units(const std::vector<MeasuredTensor>& tensors, std::uint64_t unit_bytes);

// [first, last) of the units rank `rank` of `nranks` measures.
std::pair<std::size_t, std::size_t> units_of_rank(const std::vector<Unit>& units, int rank, int nranks);

}  // namespace pulse::measure
