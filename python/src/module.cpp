// The _pulse extension module: pulse's C++ library for Python (the package pulse wraps it).
#include <Kokkos_Core.hpp>
#include <pybind11/pybind11.h>

#include "bindings.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_pulse, m) {
  m.doc() = "pulse's C++ library (PULSESync, statistics files); use the pulse package";
  // Patch encoding runs Kokkos host kernels; a host program that initialised Kokkos keeps its own.
  if (!Kokkos::is_initialized()) {
    Kokkos::initialize();
    py::module_::import("atexit").attr("register")(py::cpp_function([] { Kokkos::finalize(); }));
  }
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
}
