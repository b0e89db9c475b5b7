// libFuzzer entry: the statistics file as --resume reads it (src/io/stats_file): the run id
// (read_root_string_attribute, pulse-train's check that the file is the run's), then
// StatsFile(..., resume, keep_rows), which checks the format attribute, parses the datasets
// index and cuts every series it lists to keep_rows; the resumed file is then declared, appended
// to and flushed as pulse-train does (stats_fuzz_file.hpp). Each step must succeed or throw
// pulse::Error; a crash, a sanitizer report or any other exception escaping is a bug.
//
// The input is the file's content, which the target writes with HDF5 (a valid HDF5 file):
//   byte 0   the format attribute: 1, 2, absent, or a string
//   byte 1   the run id: absent, a string, or an integer
//   byte 2   keep_rows (mod 4)
//   byte 3   n, the datasets (mod 7), then 4 bytes each: path, type (float64, int64, string; bit 2:
//            unlimited first dimension), rank (0, 1 or 2), dimensions (two nibbles)
//   the rest the datasets index attribute (JSON text, as the file holds it)
// HDF5's own parser is not fuzzed here: on byte-level damage HDF5 1.10 can loop forever (an
// attribute read that never returns was found in this target's first form, which took the input
// as the file's bytes), and pulse does not parse HDF5 itself.
#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "io/stats_file.hpp"
#include "stats_fuzz_file.hpp"

namespace {

void write_string_attribute(hid_t file, const char* name, const std::string& value) {
  const hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, H5T_VARIABLE);
  H5Tset_cset(type, H5T_CSET_UTF8);
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t attribute = H5Acreate2(file, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  const char* text = value.c_str();
  H5Awrite(attribute, type, &text);
  H5Aclose(attribute), H5Sclose(space), H5Tclose(type);
}

void write_int_attribute(hid_t file, const char* name, std::int64_t value) {
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t attribute = H5Acreate2(file, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(attribute, H5T_NATIVE_INT64, &value);
  H5Aclose(attribute), H5Sclose(space);
}

// The file the input describes, written with HDF5 (a file of our own: no parser of HDF5's own
// format is fuzzed).
void write_file(const std::string& path, const std::uint8_t* data, std::size_t size) {
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (file < 0) std::abort();
  switch (data[0] % 4) {
    case 0: write_int_attribute(file, "pulse_stats_format", 1); break;
    case 1: write_int_attribute(file, "pulse_stats_format", 2); break;
    case 2: break;
    case 3: write_string_attribute(file, "pulse_stats_format", "1"); break;
  }
  switch (data[1] % 3) {
    case 0: break;
    case 1: write_string_attribute(file, "run_id", "0123456789abcdef0123456789abcdef"); break;
    case 2: write_int_attribute(file, "run_id", 7); break;
  }
  static const char* const paths[] = {"/steps/loss", "/steps/changed", "/kstep/sparsity", "/ranks/bytes_sent",
                                      "/absorption/step_000001/ratio_counts", "/steps", "/x"};
  std::size_t at = 4;
  const hid_t link_list = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(link_list, 1);
  for (unsigned n = data[3] % 7; n > 0 && at + 4 <= size; --n, at += 4) {
    const std::uint8_t* d = data + at;
    const unsigned kind = d[1] % 3, rank = d[2] % 3;
    const bool unlimited = d[1] & 4;
    hsize_t dims[2] = {hsize_t(d[3] & 15), hsize_t(d[3] >> 4)};
    hsize_t max_dims[2] = {unlimited ? H5S_UNLIMITED : dims[0], dims[1]};
    const hid_t space = rank == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(int(rank), dims, max_dims);
    const hid_t create = H5Pcreate(H5P_DATASET_CREATE);
    hsize_t chunk[2] = {4, dims[1] ? dims[1] : 1};
    if (unlimited && rank > 0) H5Pset_chunk(create, int(rank), chunk);
    hid_t type = kind == 0 ? H5Tcopy(H5T_IEEE_F64LE) : kind == 1 ? H5Tcopy(H5T_STD_I64LE) : H5Tcopy(H5T_C_S1);
    if (kind == 2) H5Tset_size(type, 8);
    const hid_t dataset = H5Dcreate2(file, paths[d[0] % 7], type, space, link_list, create, H5P_DEFAULT);
    if (dataset >= 0) H5Dclose(dataset);
    H5Tclose(type), H5Pclose(create), H5Sclose(space);
  }
  H5Pclose(link_list);
  if (at <= size) write_string_attribute(file, "datasets", std::string(reinterpret_cast<const char*>(data + at), size - at));
  H5Fclose(file);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  MPI_Init(argc, argv);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // a dataset the input names twice fails quietly
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/pulse-fuzz-stats-XXXXXX";
    if (!::mkdtemp(pattern.data())) std::abort();
    return pattern + "/run.h5";
  }();
  if (size < 4) return 0;
  write_file(path, data, size);
  try {
    pulse::io::read_root_string_attribute(path, "run_id");
  } catch (const pulse::Error&) {
  }
  try {
    pulse::io::StatsFile stats(MPI_COMM_SELF, path, pulse::io::StatsOpen::resume, std::int64_t(data[2] % 4));
    pulse_fuzz::declare_stats(stats);
    stats.set_attribute("resumes", std::vector<std::string>{"after step 1"});
    pulse_fuzz::append_row(stats, 0.5);
    stats.flush();
  } catch (const pulse::Error&) {
  }
  return 0;
}
