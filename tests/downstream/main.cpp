// Uses pulse through its installed headers and library; exits non-zero on a wrong value.
#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <cstdio>

#include "comm/collectives.hpp"
#include "comm/communicator.hpp"
#include "core/tensor_table.hpp"
#include "kernels/bf16.hpp"

namespace {
int failures = 0;
void expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "pulse_downstream: wrong %s\n", what);
    ++failures;
  }
}
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Kokkos::initialize(argc, argv);
  {
    expect(pulse::float_to_bf16(1.0f) == 0x3F80, "bf16 bits of 1.0");
    expect(pulse::float_to_bf16(1.0f + 0x1p-8f) == 0x3F80, "bf16 tie rounds to even");

    pulse::TensorTable table;
    table.add("wte.weight", {10, 4});
    table.add("ln.bias", {4}, false);
    expect(table.num_elements() == 44 && table.index_of("ln.bias") == 1, "tensor table");

    pulse::Communicator comm;
    const int sum = pulse::allreduce_value(comm, comm.rank() + 1, pulse::ReduceOp::sum);
    expect(sum == comm.size() * (comm.size() + 1) / 2, "allreduce sum of ranks");
    expect(comm.bytes_sent(pulse::Channel::control) == sizeof(int), "byte counter");
  }
  Kokkos::finalize();
  int any_failed = 0;
  MPI_Allreduce(&failures, &any_failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  if (any_failed == 0) std::printf("pulse_downstream: ok\n");
  return any_failed == 0 ? 0 : 1;
}
