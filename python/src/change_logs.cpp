#include "change_logs.hpp"

#include <algorithm>
#include <cstring>
#include <deque>
#include <string>

#include "coding/parallel.hpp"
#include "core/error.hpp"

namespace pulse::python {
namespace {

// Elements per block: a block of the latest version and its reverted copy stay in a core's
// cache while all the logs are reverted.
constexpr std::size_t kBlock = std::size_t(1) << 15;
// A sparse log's positions, from the start of their block (below kBlock): 2 bytes an entry
// instead of 4 or 8, so the reverts read a third less.
using Position = std::uint16_t;
static_assert(kBlock - 1 <= 0xFFFF, "a position within a block fits a Position");

template <class Word>
class Logs final : public ChangeLogs {
 public:
  explicit Logs(std::size_t keep) : keep_(keep) {}

  std::vector<std::uint64_t> stage_and_log(const std::vector<const std::byte*>& sources, std::byte* now_bytes,
                                           const std::byte* recorded_bytes, std::size_t n,
                                           const std::vector<std::uint64_t>& ends, unsigned threads) override {
    PULSE_CHECK(!ends.empty() && ends.back() == n && std::is_sorted(ends.begin(), ends.end()),
                "ChangeLogs.stage_and_log: the parameters' ends must ascend to the element count");
    PULSE_CHECK(sources.size() == ends.size(), "ChangeLogs.stage_and_log: one source per parameter");
    auto* now = reinterpret_cast<Word*>(now_bytes);
    const auto* recorded = reinterpret_cast<const Word*>(recorded_bytes);
    // Block b's elements of each parameter with a source, copied just before they are compared.
    const auto stage = [&](std::size_t b) {
      const std::size_t lo = b * kBlock, hi = std::min(n, lo + kBlock);
      std::size_t p = std::size_t(std::upper_bound(ends.begin(), ends.end(), std::uint64_t(lo)) - ends.begin());
      for (std::size_t i = lo; i < hi; ++p) {
        const std::size_t begin = p == 0 ? 0 : ends[p - 1], end = std::min<std::uint64_t>(hi, ends[p]);
        if (sources[p] != nullptr)
          std::memcpy(now + i, reinterpret_cast<const Word*>(sources[p]) + (i - begin), (end - i) * sizeof(Word));
        i = end;
      }
    };
    const std::size_t blocks = (n + kBlock - 1) / kBlock;
    // Counted first, then written straight into the log at each block's place: no buffer of
    // the whole model's positions beside the log.
    std::vector<std::vector<std::pair<std::size_t, std::uint64_t>>> counts(blocks);  // (parameter, changed)
    sync::parallel_for(threads, blocks, [&](std::size_t b) {
      stage(b);
      count(now, recorded, n, ends, b, counts[b]);
    });
    std::vector<std::uint64_t> changed(ends.size(), 0);
    std::vector<std::size_t> first(blocks + 1, 0);  // each block's first entry in a sparse log
    for (std::size_t b = 0; b < blocks; ++b) {
      first[b + 1] = first[b];
      for (const auto& [p, c] : counts[b]) changed[p] += c, first[b + 1] += c;
    }
    const std::size_t total = first[blocks];
    Log log = recycled();
    log.whole = total * (sizeof(Position) + sizeof(Word)) >= n * sizeof(Word);
    log.positions.resize(log.whole ? 0 : total);
    log.old.resize(log.whole ? n : total);
    log.block_first = log.whole ? std::vector<std::size_t>() : first;
    sync::parallel_for(threads, blocks, [&](std::size_t b) {
      const std::size_t lo = b * kBlock, hi = std::min(n, lo + kBlock);
      if (log.whole)
        std::copy(recorded + lo, recorded + hi, log.old.begin() + lo);
      else
        gather(now, recorded, lo, hi, log.positions.data() + first[b], log.old.data() + first[b]);
    });
    if (keep_ > 0) logs_.push_back(std::move(log));
    return changed;
  }

  std::map<std::size_t, std::uint64_t> differing(const std::byte* latest_bytes, std::size_t n,
                                                 const std::vector<std::size_t>& ks, unsigned threads) const override {
    const auto* latest = reinterpret_cast<const Word*>(latest_bytes);
    std::vector<std::size_t> reached;  // ascending, each once
    for (const std::size_t k : ks)
      if (k >= 1 && k <= logs_.size()) reached.push_back(k);
    std::sort(reached.begin(), reached.end());
    reached.erase(std::unique(reached.begin(), reached.end()), reached.end());
    std::map<std::size_t, std::uint64_t> out;
    if (reached.empty()) return out;
    const std::size_t blocks = (n + kBlock - 1) / kBlock;
    std::vector<std::vector<std::uint64_t>> per_block(blocks, std::vector<std::uint64_t>(reached.size()));
    sync::parallel_for(threads, blocks, [&](std::size_t b) {
      const std::size_t lo = b * kBlock, hi = std::min(n, lo + kBlock);
      thread_local std::vector<Word> scratch;  // the block of the version j steps back
      scratch.assign(latest + lo, latest + hi);
      std::size_t next = 0;  // into reached
      for (std::size_t j = 1; j <= reached.back(); ++j) {
        revert(logs_[logs_.size() - j], b, lo, hi, scratch.data());
        if (j == reached[next]) per_block[b][next++] = count_differing(scratch.data(), latest + lo, hi - lo);
      }
    });
    for (std::size_t i = 0; i < reached.size(); ++i) {
      std::uint64_t sum = 0;
      for (const auto& counts : per_block) sum += counts[i];
      out[reached[i]] = sum;
    }
    return out;
  }

  std::size_t depth() const override { return logs_.size(); }

  std::size_t bytes() const override {
    std::size_t sum = 0;
    for (const Log& log : logs_) sum += log.positions.size() * sizeof(Position) + log.old.size() * sizeof(Word);
    return sum;
  }

 private:
  struct Log {
    bool whole = false;
    std::vector<Position> positions;      // ascending within each block (a sparse log)
    std::vector<Word> old;                // the old bits at positions, or the whole old version
    std::vector<std::size_t> block_first;  // a sparse log's first entry of each block, and the count
  };
  // The changed elements of block b per parameter (those with any).
  static void count(const Word* now, const Word* recorded, std::size_t n, const std::vector<std::uint64_t>& ends,
                    std::size_t b, std::vector<std::pair<std::size_t, std::uint64_t>>& out) {
    const std::size_t lo = b * kBlock, hi = std::min(n, lo + kBlock);
    std::size_t p = std::size_t(std::upper_bound(ends.begin(), ends.end(), std::uint64_t(lo)) - ends.begin());
    for (std::size_t i = lo; i < hi; ++p) {
      const std::size_t end = std::min<std::uint64_t>(hi, ends[p]);
      const std::uint64_t c = count_differing(now + i, recorded + i, end - i);
      if (c > 0) out.emplace_back(p, c);
      i = end;
    }
  }

  // The positions and old bits of the changed elements of [lo, hi), in order: a mask of the
  // lanes that differ per 64 elements (vectorised), then its set bits.
  static void gather(const Word* now, const Word* recorded, std::size_t lo, std::size_t hi, Position* positions,
                     Word* old) {
    std::size_t c = 0;
    for (std::size_t i = lo; i < hi; i += 64) {
      const std::size_t lanes = std::min<std::size_t>(64, hi - i);
      std::uint64_t differ = 0;
      for (std::size_t l = 0; l < lanes; ++l) differ |= std::uint64_t(now[i + l] != recorded[i + l]) << l;
      for (; differ != 0; differ &= differ - 1, ++c) {
        const std::size_t at = i + std::size_t(__builtin_ctzll(differ));
        positions[c] = Position(at - lo);
        old[c] = recorded[at];
      }
    }
  }

  // Turns block b (elements [lo, hi), at block) of the version after log into the one before.
  static void revert(const Log& log, std::size_t b, std::size_t lo, std::size_t hi, Word* block) {
    if (log.whole) {
      std::copy(log.old.begin() + lo, log.old.begin() + hi, block);
      return;
    }
    for (std::size_t c = log.block_first[b]; c < log.block_first[b + 1]; ++c) block[log.positions[c]] = log.old[c];
  }

  static std::uint64_t count_differing(const Word* a, const Word* b, std::size_t m) {
    std::uint32_t count = 0;  // m <= kBlock: a 32-bit sum, which vectorises widest
    for (std::size_t i = 0; i < m; ++i) count += a[i] != b[i];
    return count;
  }

  // The oldest log's buffers once keep logs are held (dropped from the history), else new ones.
  Log recycled() {
    if (keep_ == 0 || logs_.size() < keep_) return Log{};
    Log log = std::move(logs_.front());
    logs_.pop_front();
    return log;
  }

  std::size_t keep_;
  std::deque<Log> logs_;  // oldest first
};

}  // namespace

std::unique_ptr<ChangeLogs> make_change_logs(std::size_t element_bytes, std::size_t keep) {
  switch (element_bytes) {
    case 1: return std::make_unique<Logs<std::uint8_t>>(keep);
    case 2: return std::make_unique<Logs<std::uint16_t>>(keep);
    case 4: return std::make_unique<Logs<std::uint32_t>>(keep);
    case 8: return std::make_unique<Logs<std::uint64_t>>(keep);
  }
  throw_error(__FILE__, __LINE__, "ChangeLogs: elements of 1, 2, 4 or 8 bytes, not " + std::to_string(element_bytes));
}

}  // namespace pulse::python
