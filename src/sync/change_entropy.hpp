#pragma once
// Empirical entropy of the change from one state to the next, the floor a coding of positions and
// values can approach (benchmarks compare patch sizes to it). Positions: each tensor's changed
// elements as independent draws per context, sum of n H(m / n) over contexts of n elements of
// which m change; values: the key difference key(new) - key(old) (sparse_format.hpp), sum of
// -log2 of its empirical frequency within its context. Contexts are the exponent class of the old
// value (per tensor for positions, per dtype for values: what the receiver can compute), or
// none. Estimates exclude the cost of describing the distributions themselves.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "coding/digest.hpp"

namespace pulse::sync {

struct ChangeEntropy {
  std::uint64_t changes = 0;
  double position_bits = 0;             // given tensor and exponent class
  double value_bits = 0;                // given dtype and exponent class
  double position_bits_no_context = 0;  // given the tensor only
  double value_bits_no_context = 0;     // given the dtype only
  double bits() const { return position_bits + value_bits; }
  double bits_no_context() const { return position_bits_no_context + value_bits_no_context; }
};

// A context (0-255) per element of a tensor, by tensor name: e.g.
// the age bucket of change_history.hpp, which sender and receiver both know.
using ElementContexts = std::map<std::string, std::vector<std::uint8_t>>;

// Over the tensors of sparse-coded dtypes that both states hold with the same dtype and shape.
// With contexts, the exponent class context is (exponent class, element context) for positions
// and values; tensors without contexts (or with too few) take context 0.
ChangeEntropy change_entropy(const std::vector<TensorRef>& base, const std::vector<TensorRef>& target,
                             const ElementContexts* contexts = nullptr);

}  // namespace pulse::sync
