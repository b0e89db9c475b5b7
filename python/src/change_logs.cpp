#include "change_logs.hpp"

#include <algorithm>
#include <string>

#include "coding/parallel.hpp"
#include "core/element_compare.hpp"
#include "core/error.hpp"

namespace pulse::python {
namespace {

// Elements per block: a block of the latest version and its reverted copy stay in a core's
// cache while all the logs are reverted.
constexpr std::size_t kBlock = std::size_t(1) << 15;
static_assert(kBlock <= kMaxFindElements, "a position within a block is 16-bit");

}  // namespace

ChangeLogs::ChangeLogs(std::size_t element_bytes, std::size_t keep) : element_bytes_(element_bytes), keep_(keep) {
  PULSE_CHECK(element_bytes == 1 || element_bytes == 2 || element_bytes == 4 || element_bytes == 8,
              "ChangeLogs: elements of 1, 2, 4 or 8 bytes, not " + std::to_string(element_bytes));
}

std::vector<std::uint64_t> ChangeLogs::log(const std::byte* now, const std::byte* recorded, std::size_t n,
                                           const std::vector<std::uint64_t>& ends, unsigned threads) {
  PULSE_CHECK(!ends.empty() && ends.back() == n && std::is_sorted(ends.begin(), ends.end()),
              "ChangeLogs.log: the parameters' ends must ascend to the element count");
  const std::size_t w = element_bytes_, blocks = (n + kBlock - 1) / kBlock;
  // The parameters' parts of block b: (parameter, first element, end), of those with elements there.
  const auto parts = [&](std::size_t b, auto&& f) {
    const std::size_t lo = b * kBlock, hi = std::min(n, lo + kBlock);
    std::size_t p = std::size_t(std::upper_bound(ends.begin(), ends.end(), std::uint64_t(lo)) - ends.begin());
    for (std::size_t i = lo; i < hi; ++p) {
      const std::size_t end = std::min<std::uint64_t>(hi, ends[p]);
      f(p, i, end);
      i = end;
    }
  };
  // One compare per block: the positions of its changes, which count them per parameter and
  // then fill the log.
  found_.resize(blocks);
  std::vector<std::vector<std::pair<std::size_t, std::uint64_t>>> counts(blocks);  // (parameter, changed)
  std::vector<std::uint32_t> block_changed(blocks, 0);
  sync::parallel_for(threads, blocks, [&](std::size_t b) {
    const std::size_t lo = b * kBlock;
    std::vector<std::uint16_t>& found = found_[b];
    found.clear();
    const std::size_t m = std::min(n, lo + kBlock) - lo;
    block_changed[b] = std::uint32_t(find_changes(now + lo * w, recorded + lo * w, m, w, found));
    auto first = found.begin();
    parts(b, [&](std::size_t p, std::size_t, std::size_t end) {
      const auto last = std::lower_bound(first, found.end(), end - lo);  // the changes before the part's end
      if (last != first) counts[b].emplace_back(p, std::uint64_t(last - first));
      first = last;
    });
  });
  std::vector<std::uint64_t> changed(ends.size(), 0);
  for (const auto& in_block : counts)
    for (const auto& [p, c] : in_block) changed[p] += c;
  if (keep_ == 0) return changed;
  // The oldest log's buffers once keep logs are held (dropped from the history), else new ones.
  BlockChangeLog log;
  if (logs_.size() == keep_) log = std::move(logs_.front()), logs_.pop_front();
  log.lay_out(block_changed, n, kBlock, w);
  sync::parallel_for(threads, blocks, [&](std::size_t b) {
    const std::size_t lo = b * kBlock;
    log.fill(b, found_[b], recorded + lo * w, std::min(n, lo + kBlock) - lo, w);
  });
  logs_.push_back(std::move(log));
  return changed;
}

std::map<std::size_t, std::uint64_t> ChangeLogs::differing(const std::byte* latest, std::size_t n,
                                                           const std::vector<std::size_t>& ks, unsigned threads) const {
  std::vector<std::size_t> reached;  // ascending, each once
  for (const std::size_t k : ks)
    if (k >= 1 && k <= logs_.size()) reached.push_back(k);
  std::sort(reached.begin(), reached.end());
  reached.erase(std::unique(reached.begin(), reached.end()), reached.end());
  std::map<std::size_t, std::uint64_t> out;
  if (reached.empty()) return out;
  const std::size_t w = element_bytes_, blocks = (n + kBlock - 1) / kBlock;
  std::vector<std::vector<std::uint64_t>> per_block(blocks, std::vector<std::uint64_t>(reached.size()));
  sync::parallel_for(threads, blocks, [&](std::size_t b) {
    const std::size_t lo = b * kBlock, m = std::min(n, lo + kBlock) - lo;
    thread_local std::vector<std::byte> scratch;  // the block of the version j steps back
    scratch.assign(latest + lo * w, latest + (lo + m) * w);
    std::size_t next = 0;  // into reached
    for (std::size_t j = 1; j <= reached.back(); ++j) {
      logs_[logs_.size() - j].revert(b, scratch.data(), m, w);
      if (j == reached[next]) per_block[b][next++] = count_differing(scratch.data(), latest + lo * w, m, w);
    }
  });
  for (std::size_t i = 0; i < reached.size(); ++i) {
    std::uint64_t sum = 0;
    for (const auto& in_block : per_block) sum += in_block[i];
    out[reached[i]] = sum;
  }
  return out;
}

std::size_t ChangeLogs::bytes() const {
  std::size_t sum = 0;
  for (const BlockChangeLog& log : logs_) sum += log.bytes();
  return sum;
}

}  // namespace pulse::python
