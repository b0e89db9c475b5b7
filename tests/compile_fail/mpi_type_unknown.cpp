// Must NOT compile: pulse::mpi_type rejects element types MPI has no datatype for.
#include <string>

#include "comm/mpi_type.hpp"

int main() { return pulse::mpi_type<std::string>() == MPI_CHAR ? 0 : 1; }
