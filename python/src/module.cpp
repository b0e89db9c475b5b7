// The _pulse extension module: pulse's C++ library for Python (the package pulse wraps it).
#include <pybind11/pybind11.h>

#include "bindings.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_pulse, m) {
  m.doc() = "pulse's C++ library (PULSESync, statistics files); use the pulse package";
  // pulse::Error -> pulse.Error (one line); PatchError derives from it.
  static py::exception<pulse::Error> error(m, "Error", PyExc_RuntimeError);
  static py::exception<pulse::python::PatchError> patch_error(m, "PatchError", error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const pulse::python::PatchError& e) {
      patch_error(e.what());
    } catch (const pulse::Error& e) {
      error(e.what());
    }
  });
  pulse::python::bind_sync(m);
  pulse::python::bind_decode(m);
  pulse::python::bind_stats(m);
  pulse::python::bind_sliced(m);
  pulse::python::bind_recorder(m);
}
