// pulse's HDF5 statistics writer (io/stats_file) for Python, so pulse.torch writes the same
// schema as pulse-train through the same code. The writer is collective over an MPI
// communicator; a Python process that has not initialised MPI gets a singleton MPI
// (MPI_COMM_SELF, no mpirun needed), finalised at exit.
#include <mpi.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <set>

#include "bindings.hpp"
#include "io/stats_file.hpp"
#include "train/stats_schema.hpp"

namespace py = pybind11;
using pulse::io::SeriesType;
using pulse::io::StatsFile;
using pulse::io::StatsOpen;
using pulse::io::StatsRow;
using pulse::StatsColumn;
using pulse::StatsKind;

namespace pulse::python {
namespace {

// A statistics file that Python can close; every open one is closed before MPI_Finalize at exit.
class StatsWriter {
 public:
  StatsWriter(const std::string& path, StatsOpen mode);
  ~StatsWriter() { close(); }
  StatsFile& file() {
    PULSE_CHECK(file_ != nullptr, "statistics file: already closed");
    return *file_;
  }
  void close() {
    file_.reset();
    open_writers().erase(this);
  }
  static std::set<StatsWriter*>& open_writers() {
    static std::set<StatsWriter*> writers;
    return writers;
  }

 private:
  std::unique_ptr<StatsFile> file_;
};

void ensure_mpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int provided = 0;
  PULSE_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) == MPI_SUCCESS,
              "statistics file: MPI_Init failed");
  py::module_::import("atexit").attr("register")(py::cpp_function([] {
    while (!StatsWriter::open_writers().empty()) (*StatsWriter::open_writers().begin())->close();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }));
}

StatsWriter::StatsWriter(const std::string& path, StatsOpen mode) {
  ensure_mpi();
  file_ = std::make_unique<StatsFile>(MPI_COMM_SELF, path, mode);
  open_writers().insert(this);
}

SeriesType series_type(const std::string& name) {
  PULSE_CHECK(name == "float64" || name == "int64", "statistics file: series type '" + name + "' is not float64 or int64");
  return name == "float64" ? SeriesType::float64 : SeriesType::int64;
}

StatsOpen open_mode(const std::string& name) {
  if (name == "create") return StatsOpen::create;
  if (name == "overwrite") return StatsOpen::overwrite;
  PULSE_CHECK(name == "resume", "statistics file: mode '" + name + "' is not create, overwrite or resume");
  return StatsOpen::resume;
}

}  // namespace

void bind_stats(py::module_& m) {
  // pulse-train's datasets (src/train/stats_schema), so pulse.torch declares the same ones.
  m.def("train_stats_schema", [] {
    py::list out;
    for (const StatsColumn& c : train_stats_schema()) {
      py::dict d;
      d["path"] = c.path;
      d["type"] = c.type == SeriesType::float64 ? "float64" : "int64";
      d["kind"] = c.kind == StatsKind::per_step ? "per_step" : c.kind == StatsKind::per_rank ? "per_rank" : "array";
      d["columns_attribute"] = columns_attribute(c.columns);
      d["units"] = c.units;
      d["description"] = c.description;
      out.append(d);
    }
    return out;
  });
  py::class_<StatsRow>(m, "StatsRow")
      .def(py::init<>())
      .def("set", py::overload_cast<const std::string&, double>(&StatsRow::set))
      .def("set_values", py::overload_cast<const std::string&, const std::vector<double>&>(&StatsRow::set))
      .def("set_int", py::overload_cast<const std::string&, std::int64_t>(&StatsRow::set_int))
      .def("set_ints", py::overload_cast<const std::string&, const std::vector<std::int64_t>&>(&StatsRow::set_int))
      .def("set_rank", &StatsRow::set_rank)
      .def("set_rank_int", &StatsRow::set_rank_int);

  using Path = const std::string&;
  py::class_<StatsWriter>(m, "StatsFile")
      .def(py::init([](Path path, Path mode) { return std::make_unique<StatsWriter>(path, open_mode(mode)); }),
           py::arg("path"), py::arg("mode") = "create")
      .def("set_attribute", [](StatsWriter& w, Path n, Path v) { w.file().set_attribute(n, v); })
      .def("set_attribute", [](StatsWriter& w, Path n, std::int64_t v) { w.file().set_attribute(n, v); })
      .def("set_attribute", [](StatsWriter& w, Path n, double v) { w.file().set_attribute(n, v); })
      .def("set_attribute", [](StatsWriter& w, Path n, const std::vector<std::string>& v) { w.file().set_attribute(n, v); })
      .def("set_attribute", [](StatsWriter& w, Path n, const std::vector<double>& v) { w.file().set_attribute(n, v); })
      .def("declare",
           [](StatsWriter& w, Path path, Path type, int width, Path units, Path description) {
             w.file().declare(path, series_type(type), width, units, description);
           })
      .def("declare_per_rank",
           [](StatsWriter& w, Path path, Path type, Path units, Path description) {
             w.file().declare_per_rank(path, series_type(type), units, description);
           })
      .def("set_dataset_attribute", [](StatsWriter& w, Path p, Path n, Path v) { w.file().set_dataset_attribute(p, n, v); })
      .def("set_dataset_attribute",
           [](StatsWriter& w, Path p, Path n, const std::vector<double>& v) { w.file().set_dataset_attribute(p, n, v); })
      .def("set_dataset_attribute", [](StatsWriter& w, Path p, Path n, const std::vector<std::string>& v) {
        w.file().set_dataset_attribute(p, n, v);
      })
      .def("append", [](StatsWriter& w, const StatsRow& row) { w.file().append(row); })
      .def("write_array_f64",
           [](StatsWriter& w, Path p, const std::vector<double>& data, const std::vector<std::int64_t>& dims, Path units,
              Path description) { w.file().write_array(p, data, dims, units, description); })
      .def("write_array_i64",
           [](StatsWriter& w, Path p, const std::vector<std::int64_t>& data, const std::vector<std::int64_t>& dims,
              Path units, Path description) { w.file().write_array(p, data, dims, units, description); })
      .def_property_readonly("rows", [](StatsWriter& w) { return w.file().rows(); })
      .def("close", &StatsWriter::close);
}

}  // namespace pulse::python
