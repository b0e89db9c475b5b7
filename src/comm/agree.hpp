#pragma once
// Errors that arise on some ranks only, made the error of every rank. A rank that throws while
// the others go on into a collective call leaves them waiting, and MPI_Abort, the way out, buries
// the one line that says what went wrong under its banner and every rank's lines. Agreed on, the
// error ends the job as one line from rank 0 and an orderly MPI_Finalize.
#include <mpi.h>

#include <functional>

#include "core/agreed_error.hpp"

namespace pulse {

// Runs work on every rank of comm, then agrees (collective): if it threw on any rank, every
// rank throws AgreedError with the message of the lowest rank that failed. work may hold local
// work and collective calls that fail on every rank alike, never a collective call that one
// rank's error could leave half made. The agreement's few bytes go uncounted by Communicator.
void agree_on_error(MPI_Comm comm, const std::function<void()>& work);

}  // namespace pulse
