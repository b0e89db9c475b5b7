#pragma once
// pulse::Communicator: an owned duplicate of an MPI communicator plus per-channel byte counters.
// It is a handle: copies share the MPI communicator and the counters; the communicator is freed
// when the last copy goes (unless MPI is already finalized). Errors come back from MPI as return
// codes (MPI_ERRORS_RETURN) and are thrown as pulse::Error.
#include <mpi.h>

#include <array>
#include <cstdint>
#include <memory>

namespace pulse {

// What the bytes sent between ranks are for; the statistics file reports bytes per rank and channel.
enum class Channel : int {
  control,           // counts, scalars, metadata
  gradients,         // DDP gradient allreduce
  pseudo_gradients,  // DiLoCo / PULSELoCo outer exchange
  patches,           // PULSESync patches
  weights,           // dense weights (anchors, baselines)
  rollouts,          // sampled completions from inference ranks to trainers
};
inline constexpr int num_channels = 6;
const char* channel_name(Channel channel);

// Throws pulse::Error "<what> failed: <MPI's error string>" unless rc is MPI_SUCCESS.
void check_mpi(int rc, const char* what);

class Communicator {
 public:
  // Duplicates `comm`, so pulse's messages never match the caller's. MPI must be initialized.
  explicit Communicator(MPI_Comm comm = MPI_COMM_WORLD);

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm raw() const { return comm_; }

  // MPI_Comm_split: ranks with the same color (>= 0) form a new communicator, ordered by key
  // (ties by rank here). The new communicator counts its bytes separately. Collective.
  Communicator split(int color, int key) const;
  void barrier() const;

  // Bytes this rank sent to, and received from, the other ranks (comm/collectives.hpp says how
  // each collective counts), since construction or the last reset.
  std::uint64_t bytes_sent(Channel channel) const;
  std::uint64_t bytes_received(Channel channel) const;
  void reset_counters();
  // Called by the collectives.
  void count_bytes(Channel channel, std::uint64_t sent, std::uint64_t received) const;

 private:
  struct State;
  static std::shared_ptr<State> make_state();
  static std::shared_ptr<State> duplicate(MPI_Comm comm);
  explicit Communicator(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;  // owns comm_, holds the counters
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace pulse
