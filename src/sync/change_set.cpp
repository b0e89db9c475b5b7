#include "sync/change_set.hpp"

#include <algorithm>
#include <string>

#include "core/error.hpp"

namespace pulse::sync {

std::vector<index_t> tensor_begins(const std::vector<index_t>& indices, const std::vector<index_t>& offsets) {
  PULSE_CHECK(!offsets.empty(), "change set: no tensor offsets");
  std::vector<index_t> begins{0};
  auto at = indices.begin();
  for (std::size_t t = 1; t < offsets.size(); ++t) {
    at = std::lower_bound(at, indices.end(), offsets[t]);
    begins.push_back(index_t(at - indices.begin()));
  }
  begins.back() = index_t(indices.size());  // indices past the last tensor fail check_change_set
  return begins;
}

void check_change_set(const ChangeSet& set, const std::vector<index_t>& offsets) {
  PULSE_CHECK(!offsets.empty() && set.tensor_begin.size() == offsets.size(),
              "change set: " + std::to_string(set.num_tensors()) + " tensors, the state has " +
                  std::to_string(offsets.empty() ? 0 : offsets.size() - 1));
  PULSE_CHECK(set.new_bits.size() == set.size() && (set.old_bits.empty() || set.old_bits.size() == set.size()),
              "change set: " + std::to_string(set.size()) + " indices, " + std::to_string(set.new_bits.size()) +
                  " new and " + std::to_string(set.old_bits.size()) + " old values");
  PULSE_CHECK(set.tensor_begin.front() == 0 && set.tensor_begin.back() == index_t(set.size()),
              "change set: the tensors' changes do not cover its list");
  for (std::size_t t = 0; t + 1 < offsets.size(); ++t) {
    PULSE_CHECK(set.tensor_begin[t] <= set.tensor_begin[t + 1], "change set: tensor begins decrease at tensor " + std::to_string(t));
    for (index_t j = set.tensor_begin[t]; j < set.tensor_begin[t + 1]; ++j) {
      const index_t i = set.indices[std::size_t(j)];
      PULSE_CHECK(i >= offsets[t] && i < offsets[t + 1] && (j == 0 || i > set.indices[std::size_t(j) - 1]),
                  "change set: index " + std::to_string(i) + " is not sorted, distinct and inside tensor " + std::to_string(t));
    }
  }
}

void apply_change_set(ChangeSet& set, std::uint16_t* state, std::size_t n) {
  PULSE_CHECK(set.new_bits.size() == set.size(), "change set: indices and new values differ in length");
  for (const index_t i : set.indices)  // all checked first: a refused set leaves the state as it was
    PULSE_CHECK(i >= 0 && std::size_t(i) < n, "change set: index " + std::to_string(i) + " outside " + std::to_string(n));
  set.old_bits.resize(set.size());
  for (std::size_t j = 0; j < set.size(); ++j) {
    set.old_bits[j] = state[set.indices[j]];
    state[set.indices[j]] = set.new_bits[j];
  }
}

void revert_change_set(const ChangeSet& set, std::uint16_t* state, std::size_t n) {
  PULSE_CHECK(set.old_bits.size() == set.size(), "change set: no old values to revert to");
  for (const index_t i : set.indices)
    PULSE_CHECK(i >= 0 && std::size_t(i) < n, "change set: index " + std::to_string(i) + " outside " + std::to_string(n));
  for (std::size_t j = 0; j < set.size(); ++j) state[set.indices[j]] = set.old_bits[j];
}

}  // namespace pulse::sync
