// PULSELoCo / DiLoCo outer synchronisation at np 1/2/4, against a reference written here from
// docs/loco.md's equations (its own BF16 cast, gate, error feedback, rank-order sum and PyTorch's
// SGD(nesterov=True) update), plus the invariants: error feedback conserves every pseudo-
// gradient entry, all trainers hold the same bits, a gate that fires everywhere reduces
// PULSELoCo to DiLoCo, both sparse exchanges agree, and the byte counters match the payloads.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "comm/collectives.hpp"
#include "core/error.hpp"
#include "kernels/host_copy.hpp"
#include "kernels/outer_sgd.hpp"
#include "loco/exchange.hpp"
#include "loco/outer_sync.hpp"
#include "loco/sparse_payload.hpp"
#include "support/backends.hpp"

namespace {

using pulse::index_t;
using pulse::loco::OuterHyper;
using pulse::loco::OuterStats;
using pulse::loco::OuterSync;
using pulse::loco::SparseExchange;
using pulse::loco::TrainerSync;

std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

// Round to nearest even by comparing the dropped half-word with the halfway point.
std::uint16_t reference_bf16(float x) {
  const std::uint32_t u = bits_of(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  const std::uint32_t toward_zero = u >> 16, dropped = u & 0xFFFFu;
  if (dropped > 0x8000u || (dropped == 0x8000u && (toward_zero & 1u))) return static_cast<std::uint16_t>(toward_zero + 1);
  return static_cast<std::uint16_t>(toward_zero);
}

pulse::Communicator world() { return pulse::Communicator(MPI_COMM_WORLD); }

// Weights of mixed magnitudes, the same on every rank.
std::vector<float> initial_weights(std::size_t n) {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-6, 2);
  std::vector<float> theta(n);
  for (auto& t : theta) t = std::ldexp(mantissa(rng), exponent(rng));
  return theta;
}

// What H inner steps did to this rank's weights at outer step `step`: relative moves of
// about `scale`, different on every rank.
std::vector<float> local_after_inner_steps(const std::vector<float>& theta_global, int rank, int step, float scale) {
  std::mt19937 rng(100 + 17 * rank + 1000 * step);
  std::normal_distribution<float> rel(0.0f, scale);
  std::vector<float> local(theta_global.size());
  for (std::size_t i = 0; i < local.size(); ++i) local[i] = theta_global[i] * (1.0f + rel(rng)) + 1e-4f * rel(rng);
  return local;
}

// Moves of a quarter of each weight and more: the gate fires on every element.
std::vector<float> large_moves(const std::vector<float>& theta_global, int rank, int step) {
  std::mt19937 rng(300 + 17 * rank + 1000 * step);
  std::uniform_real_distribution<float> extra(0.0f, 0.1f);
  std::vector<float> local(theta_global.size());
  for (std::size_t i = 0; i < local.size(); ++i)
    local[i] = theta_global[i] + (std::fabs(theta_global[i]) * (0.25f + extra(rng)) + 0.01f);
  return local;
}

std::vector<float> host_of(Kokkos::View<const float*> v) { return pulse::to_host(v); }

// Every rank's vector, rank after rank.
template <class T>
std::vector<T> gather_all(const pulse::Communicator& comm, const std::vector<T>& mine) {
  std::vector<T> all(mine.size() * comm.size());
  pulse::allgather(comm, pulse::as_view(mine.data(), mine.size()), pulse::as_view(all.data(), all.size()));
  return all;
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (bits_of(a[i]) != bits_of(b[i]) && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " elements differ, first at " << first << " (" << a[first] << " vs "
                     << b[first] << ")";
}

// Runs `steps` outer steps and returns theta_g after each.
// scale 0: large_moves.
std::vector<std::vector<float>> run(OuterSync& sync, const std::vector<float>& theta0, int steps, float scale,
                                    std::vector<OuterStats>* stats = nullptr) {
  const int rank = world().rank();
  std::vector<std::vector<float>> history;
  std::vector<float> global = theta0;
  for (int step = 0; step < steps; ++step) {
    auto local = pulse::to_device(scale == 0 ? large_moves(global, rank, step)
                                             : local_after_inner_steps(global, rank, step, scale));
    const OuterStats s = sync.outer_step(local);
    if (stats) stats->push_back(s);
    global = host_of(sync.theta_global());
    expect_same_bits(pulse::to_host(local), global, "theta_local after the reset");
    history.push_back(global);
  }
  return history;
}

TEST(Loco, ParseTrainerSync) {
  EXPECT_EQ(pulse::loco::parse_trainer_sync("ddp"), TrainerSync::ddp);
  EXPECT_EQ(pulse::loco::parse_trainer_sync("diloco"), TrainerSync::diloco);
  EXPECT_EQ(pulse::loco::parse_trainer_sync("pulseloco"), TrainerSync::pulseloco);
  try {
    pulse::loco::parse_trainer_sync("loco");
    FAIL() << "accepted 'loco'";
  } catch (const pulse::Error& e) {
    EXPECT_NE(std::string(e.what()).find("ddp, diloco, pulseloco"), std::string::npos) << e.what();
  }
  EXPECT_THROW(OuterSync(TrainerSync::ddp, world(), pulse::to_device(std::vector<float>(4, 1.0f)), OuterHyper{}),
               pulse::Error);
}

TEST(Loco, RefusesDifferentStartingWeights) {
  auto comm = world();
  if (comm.size() == 1) GTEST_SKIP() << "needs two trainers";
  std::vector<float> theta(16, 1.0f);
  theta[3] = comm.rank() == 1 ? 2.0f : 1.0f;
  EXPECT_THROW(OuterSync(TrainerSync::diloco, comm, pulse::to_device(theta), OuterHyper{}), pulse::Error);
}

// Hand-derived: lr 0.5, momentum 0.5, two trainers, summed pseudo-gradient 4 then 2.
// Step 1: g = 2, buf = 2, d = 2 + 0.5 * 2 = 3, theta = 10 - 1.5 = 8.5.
// Step 2: g = 1, buf = 0.5 * 2 + 1 = 2, d = 1 + 0.5 * 2 = 2, theta = 8.5 - 1 = 7.5.
// Without Nesterov, d = buf: 10 - 0.5 * 2 = 9, then 9 - 0.5 * 2 = 8.
template <class B>
using OuterSgd = pulse::test::OnBackend<B>;
TYPED_TEST_SUITE(OuterSgd, pulse::test::BackendTypes, pulse::test::BackendNames);

TYPED_TEST(OuterSgd, HandDerived) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  for (const bool nesterov : {true, false}) {
    auto theta = pulse::to_device<Mem>(std::vector<float>{10.0f, -0.0f});
    Kokkos::View<float*, Mem> momentum("momentum", 2);
    for (int step = 0; step < 2; ++step) {
      const float summed = step == 0 ? 4.0f : 2.0f;
      const pulse::OuterSgdScalars s{0.5f, 0.5f, 2.0f, nesterov, step == 0};
      pulse::outer_sgd(space, s, theta, momentum, pulse::to_device<Mem>(std::vector<float>{summed, -0.0f}));
    }
    const auto t = pulse::to_host(theta);
    const auto m = pulse::to_host(momentum);
    EXPECT_EQ(t[0], nesterov ? 7.5f : 8.0f);
    EXPECT_EQ(m[0], 2.0f);
    // PyTorch clones a -0 gradient into the momentum and steps -0 by +0 to +0.
    EXPECT_EQ(bits_of(m[1]), 0x80000000u);
    EXPECT_EQ(bits_of(t[1]), 0u);
  }
}

// Gradients as large as the weights, so the roundings of PyTorch's fused add(alpha) show in
// theta: two steps against a plain loop of the formula (checked against torch 1.13's SGD once:
// 0 of 4096 elements differ fused, 1786 unfused), and the unfused variant must differ.
TYPED_TEST(OuterSgd, MatchesFusedFormula) {
  using Mem = typename TypeParam::Mem;
  const typename TypeParam::ExecSpace space;
  const std::size_t n = 4096;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> theta(n), sums[2] = {std::vector<float>(n), std::vector<float>(n)};
  for (auto& t : theta) t = normal(rng);
  for (auto& s : sums)
    for (auto& v : s) v = 3.0f * normal(rng);
  auto theta_view = pulse::to_device<Mem>(theta);
  Kokkos::View<float*, Mem> momentum("momentum", n);
  std::vector<float> fused = theta, unfused = theta, buf(n), buf_unfused(n);
  for (int step = 0; step < 2; ++step) {
    const pulse::OuterSgdScalars s{0.7f, 0.9f, 3.0f, true, step == 0};
    pulse::outer_sgd(space, s, theta_view, momentum, pulse::to_device<Mem>(sums[step]));
    for (std::size_t i = 0; i < n; ++i) {
      const float g = sums[step][i] / 3.0f;
      buf[i] = step == 0 ? g : 0.9f * buf[i] + g;
      fused[i] = std::fmaf(std::fmaf(buf[i], 0.9f, g), -0.7f, fused[i]);
      buf_unfused[i] = step == 0 ? g : 0.9f * buf_unfused[i] + g;
      const volatile float d = buf_unfused[i] * 0.9f + g;
      const volatile float stepped = d * -0.7f;
      unfused[i] = unfused[i] + stepped;
    }
  }
  const auto result = pulse::to_host(theta_view);
  expect_same_bits(result, fused, "theta vs the fused formula");
  std::size_t differ = 0;
  for (std::size_t i = 0; i < n; ++i) differ += bits_of(result[i]) != bits_of(unfused[i]);
  EXPECT_GT(differ, n / 10) << "the test cannot tell fused from unfused";
}

// Three outer steps against the reference written from docs/loco.md: per element, per rank.
TEST(Loco, PulseLocoMatchesReference) {
  auto comm = world();
  const int ranks = comm.size(), rank = comm.rank();
  const std::size_t n = 3000;
  const OuterHyper hyper{0.7, 0.9, true};
  const auto theta0 = initial_weights(n);
  for (const auto exchange : {SparseExchange::allgather, SparseExchange::sparse_allreduce}) {
    OuterSync sync(TrainerSync::pulseloco, comm, pulse::to_device(theta0), hyper, exchange);
    std::vector<float> theta_ref = theta0, momentum_ref(n, 0.0f), error_ref(n, 0.0f);
    for (int step = 0; step < 3; ++step) {
      const auto local = local_after_inner_steps(theta_ref, rank, step, 2e-3f);
      // s = e + delta; gate on theta_g; e keeps what is not sent.
      std::vector<float> s(n), sent(n, 0.0f);
      std::vector<std::uint8_t> fire(n);
      index_t fired = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const volatile float delta = theta_ref[i] - local[i];
        s[i] = error_ref[i] + delta;
        const volatile float stepped = theta_ref[i] - s[i];
        fire[i] = reference_bf16(theta_ref[i]) != reference_bf16(stepped);
        fired += fire[i];
      }
      auto local_view = pulse::to_device(local);
      const OuterStats stats = sync.outer_step(local_view);
      EXPECT_EQ(stats.fired, fired) << "step " << step;
      EXPECT_GT(fired, 0);
      EXPECT_LT(fired, index_t(n));

      // Error feedback conserves s: a fired entry leaves as s with +0 behind; an unfired one
      // stays bit for bit.
      const auto error = pulse::to_host(sync.error_buffer());
      std::size_t not_conserved = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint32_t expected = fire[i] ? 0u : bits_of(s[i]);
        not_conserved += bits_of(error[i]) != expected;
        error_ref[i] = fire[i] ? 0.0f : s[i];
        if (fire[i]) sent[i] = s[i];
      }
      EXPECT_EQ(not_conserved, 0u) << "step " << step;
      // Rank-order sum of what everyone sent, average, PyTorch's Nesterov SGD.
      const auto all_sent = gather_all(comm, sent);
      const auto all_fire = gather_all(comm, fire);
      for (std::size_t i = 0; i < n; ++i) {
        float sum = 0.0f;
        for (int r = 0; r < ranks; ++r)
          if (all_fire[r * n + i]) sum += all_sent[r * n + i];
        const float g = sum / static_cast<float>(ranks);
        momentum_ref[i] = step == 0 ? g : 0.9f * momentum_ref[i] + g;
        const float d = std::fmaf(momentum_ref[i], 0.9f, g);
        theta_ref[i] = std::fmaf(d, -0.7f, theta_ref[i]);
      }
      expect_same_bits(host_of(sync.theta_global()), theta_ref, "theta_g");
      expect_same_bits(pulse::to_host(sync.momentum_buffer()), momentum_ref, "momentum");
    }
    EXPECT_EQ(sync.outer_steps(), 3);
  }
}

TEST(Loco, ThetaGlobalIdenticalOnEveryTrainer) {
  auto comm = world();
  const std::size_t n = 5000;
  const auto theta0 = initial_weights(n);
  struct Case {
    TrainerSync mode;
    SparseExchange exchange;
  };
  for (const Case c : {Case{TrainerSync::diloco, SparseExchange::allgather},
                       Case{TrainerSync::pulseloco, SparseExchange::allgather},
                       Case{TrainerSync::pulseloco, SparseExchange::sparse_allreduce}}) {
    OuterSync sync(c.mode, comm, pulse::to_device(theta0), OuterHyper{});
    const auto history = run(sync, theta0, 5, 3e-3f);
    const auto all = gather_all(comm, history.back());
    for (int r = 1; r < comm.size(); ++r)
      expect_same_bits(std::vector<float>(all.begin() + r * n, all.begin() + (r + 1) * n),
                       std::vector<float>(all.begin(), all.begin() + n), "theta_g of rank r vs rank 0");
    EXPECT_NE(bits_of(history.back()[0]) ^ bits_of(theta0[0]), 0u) << "the weights never moved";
  }
}

// Moves of 30% fire the gate everywhere; the sums are then DiLoCo's, bit for bit.
TEST(Loco, GateFiringEverywhereIsDiLoCo) {
  auto comm = world();
  const std::size_t n = 4099;  // not a multiple of the rank count
  const auto theta0 = initial_weights(n);
  OuterSync diloco(TrainerSync::diloco, comm, pulse::to_device(theta0), OuterHyper{});
  const auto reference = run(diloco, theta0, 4, 0);
  for (const auto exchange : {SparseExchange::allgather, SparseExchange::sparse_allreduce}) {
    for (const double threshold : {0.25, 1.0}) {
      OuterSync loco(TrainerSync::pulseloco, comm, pulse::to_device(theta0), OuterHyper{}, exchange, threshold);
      std::vector<OuterStats> stats;
      const auto history = run(loco, theta0, 4, 0, &stats);
      for (int step = 0; step < 4; ++step) {
        EXPECT_EQ(stats[step].fired, index_t(n)) << "the gate did not fire everywhere at step " << step;
        EXPECT_EQ(stats[step].went_dense, exchange == SparseExchange::sparse_allreduce && threshold < 1.0);
        expect_same_bits(history[step], reference[step], "PULSELoCo vs DiLoCo");
      }
    }
  }
}

// At a few percent density the sparse reduce-scatter, its dense fallback and the allgather
// agree bit for bit.
TEST(Loco, SparseExchangesAgree) {
  auto comm = world();
  const std::size_t n = 6000;
  const auto theta0 = initial_weights(n);
  OuterSync gather(TrainerSync::pulseloco, comm, pulse::to_device(theta0), OuterHyper{}, SparseExchange::allgather);
  OuterSync sparse(TrainerSync::pulseloco, comm, pulse::to_device(theta0), OuterHyper{},
                   SparseExchange::sparse_allreduce, 1.0);
  OuterSync dense(TrainerSync::pulseloco, comm, pulse::to_device(theta0), OuterHyper{},
                  SparseExchange::sparse_allreduce, 0.0);
  std::vector<OuterStats> sparse_stats, dense_stats;
  const auto a = run(gather, theta0, 4, 2e-3f);
  const auto b = run(sparse, theta0, 4, 2e-3f, &sparse_stats);
  const auto c = run(dense, theta0, 4, 2e-3f, &dense_stats);
  for (int step = 0; step < 4; ++step) {
    EXPECT_FALSE(sparse_stats[step].went_dense);
    EXPECT_TRUE(dense_stats[step].went_dense);
    EXPECT_GT(sparse_stats[step].density, 0.0);
    EXPECT_LT(sparse_stats[step].density, 0.5);
    expect_same_bits(b[step], a[step], "sparse allreduce vs allgather");
    expect_same_bits(c[step], a[step], "dense fallback vs allgather");
  }
}

// Bytes on Channel::pseudo_gradients are exactly the payloads that go to the other trainers.
TEST(Loco, BytesMatchPayloads) {
  auto comm = world();
  const int ranks = comm.size(), rank = comm.rank();
  const std::size_t n = 4000;
  const auto theta0 = initial_weights(n);
  {
    // Allgather: the int64 count, then this rank's payload; every rank receives all of them.
    OuterSync sync(TrainerSync::pulseloco, comm, pulse::to_device(theta0), OuterHyper{});
    const auto local = local_after_inner_steps(theta0, rank, 0, 2e-3f);
    std::vector<index_t> indices;
    std::vector<float> values;
    for (std::size_t i = 0; i < n; ++i) {
      const float s = theta0[i] - local[i];
      if (reference_bf16(theta0[i]) != reference_bf16(theta0[i] - s)) {
        indices.push_back(static_cast<index_t>(i));
        values.push_back(s);
      }
    }
    const auto payload = pulse::loco::encode_sparse_payload(indices.data(), values.data(), indices.size(), 0);
    auto local_view = pulse::to_device(local);
    const OuterStats stats = sync.outer_step(local_view);
    EXPECT_EQ(stats.payload_bytes, payload.size());
    EXPECT_LT(payload.size(), 8 * indices.size() + 16) << "coding should beat 8 bytes per pair";
    const auto sizes = gather_all(comm, std::vector<std::uint64_t>{payload.size()});
    std::uint64_t all = 0;
    for (auto s : sizes) all += s;
    // Each of the other ranks gets this rank's count and payload.
    const std::uint64_t others = ranks - 1;
    EXPECT_EQ(stats.bytes_sent, others * (8 + payload.size()));
    EXPECT_EQ(stats.bytes_received, 8u * others + all - payload.size());
  }
  {
    // DiLoCo: alltoallv of the other ranks' chunks, allgatherv of this rank's chunk sum to the
    // others (the chunk a rank keeps is never sent).
    OuterSync sync(TrainerSync::diloco, comm, pulse::to_device(theta0), OuterHyper{});
    auto local_view = pulse::to_device(local_after_inner_steps(theta0, rank, 0, 2e-3f));
    const OuterStats stats = sync.outer_step(local_view);
    const std::uint64_t chunk = pulse::loco::chunk_begin(n, ranks, rank + 1) - pulse::loco::chunk_begin(n, ranks, rank);
    const std::uint64_t others = ranks - 1;
    EXPECT_EQ(stats.bytes_sent, 4 * (n - chunk) + 8 * others + 4 * chunk * others);
    EXPECT_EQ(stats.bytes_received, 4 * chunk * others + 8 * others + 4 * (n - chunk));
    EXPECT_EQ(stats.fired, index_t(n));
    EXPECT_TRUE(stats.went_dense);
  }
}

// The payload codec: exact round trip of any FP32 bits, and loud failure on damaged input.
TEST(Loco, PayloadRoundTripAndValidation) {
  std::mt19937 rng(7);
  for (const std::size_t count : {std::size_t(0), std::size_t(1), std::size_t(700)}) {
    for (const bool compressible : {false, true}) {
      std::vector<index_t> indices;
      std::vector<float> values;
      index_t next = 50;
      for (std::size_t k = 0; k < count; ++k) {
        next += 1 + rng() % 300;
        indices.push_back(next);
        const std::uint32_t bits = compressible ? 0x3F800000u + (rng() % 4) : static_cast<std::uint32_t>(rng());
        float v;
        std::memcpy(&v, &bits, 4);
        values.push_back(v);
      }
      if (count > 0) values[0] = -0.0f;
      const auto bytes = pulse::loco::encode_sparse_payload(indices.data(), values.data(), count, 50);
      // Uncompressed: flag, count varint, one or two bytes per gap (gaps < 300), four per value.
      std::size_t raw_size = 1 + (count < 128 ? 1 : 2) + 4 * count;
      for (std::size_t k = 0; k < count; ++k) raw_size += indices[k] - (k ? indices[k - 1] + 1 : 50) < 128 ? 1 : 2;
      if (bytes[0] == 0) EXPECT_EQ(bytes.size(), raw_size);
      EXPECT_LE(bytes.size(), raw_size);
      if (count == 700 && compressible) EXPECT_EQ(bytes[0], 1) << "four distinct values must compress";
      pulse::loco::SparsePairs out;
      pulse::loco::decode_sparse_payload(bytes.data(), bytes.size(), 50, next + 1, out);
      ASSERT_EQ(out.indices, indices);
      for (std::size_t k = 0; k < count; ++k) ASSERT_EQ(bits_of(out.values[k]), bits_of(values[k]));
      if (count == 0) continue;
      EXPECT_THROW(pulse::loco::decode_sparse_payload(bytes.data(), bytes.size(), 50, next, out), pulse::Error);
      EXPECT_THROW(pulse::loco::decode_sparse_payload(bytes.data(), bytes.size() - 1, 50, next + 1, out),
                   pulse::Error);
      auto longer = bytes;
      longer.push_back(0);
      EXPECT_THROW(pulse::loco::decode_sparse_payload(longer.data(), longer.size(), 50, next + 1, out), pulse::Error);
    }
  }
}

}  // namespace
