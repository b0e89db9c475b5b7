#pragma once
// The parts of the _pulse extension module, each bound by its own file.
#include <pybind11/pybind11.h>

#include "core/error.hpp"

namespace pulse::python {

// A patch that cannot be parsed or applied (pulse.PatchError); the state is unchanged.
class PatchError : public Error {
 public:
  using Error::Error;
};

void bind_sync(pybind11::module_& m);    // sync_bindings.cpp
void bind_decode(pybind11::module_& m);  // decode_bindings.cpp
void bind_stats(pybind11::module_& m);   // stats_bindings.cpp
void bind_sliced(pybind11::module_& m);  // sliced_bindings.cpp
void bind_recorder(pybind11::module_& m);  // recorder_bindings.cpp

}  // namespace pulse::python
