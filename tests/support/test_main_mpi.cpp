// GoogleTest main for MPI tests: every rank runs every test; rank 0 prints the usual report,
// other ranks print only their failures (tagged with the rank), and the process fails when
// any rank failed, so mpiexec's exit status tells the whole story.
#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <string>

namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  // The name is kept here: asking UnitTest for the current test inside OnTestPartResult takes
  // a lock gtest already holds there, and the rank would hang instead of reporting.
  void OnTestStart(const ::testing::TestInfo& test) override {
    test_ = std::string(test.test_suite_name()) + "." + test.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s failed at %s:%d\n%s\n", rank_, test_.c_str(),
                 result.file_name() ? result.file_name() : "?", result.line_number(), result.message());
  }

 private:
  int rank_;
  std::string test_;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Kokkos::initialize(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  int local_failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&local_failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  Kokkos::finalize();
  MPI_Finalize();
  return any_failed;
}
