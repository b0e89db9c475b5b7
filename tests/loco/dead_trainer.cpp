// A trainer that dies before an outer step: rank 1 leaves by exit(1) or SIGKILL while the
// others enter the exchange. run_dead_trainer.cmake checks that mpiexec then ends the whole
// job with a non-zero status instead of leaving the survivors blocked in MPI.
#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <csignal>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/host_copy.hpp"
#include "loco/outer_sync.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    const std::string how = argc > 1 ? argv[1] : "exit";
    const pulse::Communicator trainers(MPI_COMM_WORLD);
    std::vector<float> theta(1 << 16, 0.5f);
    pulse::loco::OuterSync sync(pulse::loco::TrainerSync::pulseloco, trainers, pulse::to_device(theta),
                                pulse::loco::OuterHyper{});
    if (trainers.rank() == 1) {
      if (how == "kill") std::raise(SIGKILL);
      std::exit(1);
    }
    for (auto& t : theta) t = 0.75f;
    auto local = pulse::to_device(theta);
    sync.outer_step(local);  // the survivors block here until mpiexec ends the job
    status = 3;              // reaching this means the dead rank went unnoticed
  }
  MPI_Finalize();
  return status;
}
