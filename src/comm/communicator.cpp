#include "comm/communicator.hpp"

#include <string>

#include "comm/wait.hpp"
#include "core/error.hpp"

namespace pulse {

struct Communicator::State {
  MPI_Comm comm = MPI_COMM_NULL;
  std::array<std::uint64_t, num_channels> sent{};
  std::array<std::uint64_t, num_channels> received{};
};

namespace {

int channel_index(Channel channel) {
  const int i = static_cast<int>(channel);
  PULSE_CHECK(i >= 0 && i < num_channels, "invalid channel " + std::to_string(i));
  return i;
}

}  // namespace

const char* channel_name(Channel channel) {
  switch (channel) {
    case Channel::control: return "control";
    case Channel::gradients: return "gradients";
    case Channel::pseudo_gradients: return "pseudo_gradients";
    case Channel::patches: return "patches";
    case Channel::weights: return "weights";
    case Channel::rollouts: return "rollouts";
  }
  return "invalid";
}

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS) length = 0;
  throw_error(__FILE__, __LINE__,
              std::string(what) + " failed: " +
                  (length > 0 ? std::string(text, length) : "MPI error " + std::to_string(rc)));
}

std::shared_ptr<Communicator::State> Communicator::make_state() {
  // A Communicator may outlive MPI_Finalize (a static, a leaked copy); freeing then is an error.
  return std::shared_ptr<State>(new State, [](State* state) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && state->comm != MPI_COMM_NULL) MPI_Comm_free(&state->comm);
    delete state;
  });
}

std::shared_ptr<Communicator::State> Communicator::duplicate(MPI_Comm comm) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  PULSE_CHECK(initialized, "pulse::Communicator created before MPI_Init");
  PULSE_CHECK(comm != MPI_COMM_NULL, "pulse::Communicator created from MPI_COMM_NULL");
  auto state = make_state();
  check_mpi(MPI_Comm_dup(comm, &state->comm), "MPI_Comm_dup");
  return state;
}

Communicator::Communicator(MPI_Comm comm) : Communicator(duplicate(comm)) {}

Communicator::Communicator(std::shared_ptr<State> state)
    : state_(std::move(state)), comm_(state_->comm) {
  check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
}

Communicator Communicator::split(int color, int key) const {
  PULSE_CHECK(color >= 0, "Communicator::split: color must be >= 0, got " + std::to_string(color));
  auto state = make_state();
  check_mpi(MPI_Comm_split(raw(), color, key, &state->comm), "MPI_Comm_split");
  return Communicator(std::move(state));
}

void Communicator::barrier() const {
  const WaitClock clock;
  collective_call("MPI_Barrier", [&] { return MPI_Barrier(raw()); },
                  [&](MPI_Request* request) { return MPI_Ibarrier(raw(), request); });
}

std::uint64_t Communicator::bytes_sent(Channel channel) const {
  return state_->sent[channel_index(channel)];
}

std::uint64_t Communicator::bytes_received(Channel channel) const {
  return state_->received[channel_index(channel)];
}

void Communicator::reset_counters() {
  state_->sent.fill(0);
  state_->received.fill(0);
}

void Communicator::count_bytes(Channel channel, std::uint64_t sent, std::uint64_t received) const {
  const int i = channel_index(channel);
  state_->sent[i] += sent;
  state_->received[i] += received;
}

}  // namespace pulse
