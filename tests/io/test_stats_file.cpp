// pulse::io::StatsFile at np 1/2/4: every rank writes through parallel HDF5, then rank 0 reads the
// file back with plain serial HDF5 calls (an independent path through the library).
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "io/stats_file.hpp"

namespace {

using pulse::io::SeriesType;
using pulse::io::StatsFile;
using pulse::io::StatsOpen;
using pulse::io::StatsRow;

int rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int nranks() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// A fresh folder shared by all ranks (rank 0 makes it, everyone learns its name), removed at the end.
struct Folder {
  std::string path;
  Folder() {
    if (rank() == 0) {
      const char* tmp = std::getenv("TMPDIR");
      std::string pattern = std::string(tmp ? tmp : "/tmp") + "/pulse_stats_XXXXXX";
      path = mkdtemp(pattern.data()) ? pattern : "";
    }
    int length = static_cast<int>(path.size());
    MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
    path.resize(length);
    MPI_Bcast(path.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD);
    EXPECT_FALSE(path.empty());
  }
  ~Folder() {
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank() == 0 && !path.empty()) std::filesystem::remove_all(path);
  }
};

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// ---- serial readers (rank 0) ----
struct Read {
  std::vector<hsize_t> dims;
  std::vector<double> f64;
  std::vector<std::int64_t> i64;
};
Read read_dataset(const std::string& file_path, const std::string& object) {
  Read out;
  hid_t file = H5Fopen(file_path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  EXPECT_GE(file, 0);
  hid_t dataset = H5Dopen2(file, object.c_str(), H5P_DEFAULT);
  EXPECT_GE(dataset, 0) << object;
  hid_t space = H5Dget_space(dataset);
  out.dims.resize(H5Sget_simple_extent_ndims(space));
  H5Sget_simple_extent_dims(space, out.dims.data(), nullptr);
  const auto n = static_cast<std::size_t>(H5Sget_simple_extent_npoints(space));
  hid_t type = H5Dget_type(dataset);
  if (H5Tget_class(type) == H5T_FLOAT) {
    out.f64.resize(n);
    EXPECT_GE(H5Dread(dataset, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.f64.data()), 0);
  } else {
    out.i64.resize(n);
    EXPECT_GE(H5Dread(dataset, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.i64.data()), 0);
  }
  H5Tclose(type);
  H5Sclose(space);
  H5Dclose(dataset);
  H5Fclose(file);
  return out;
}
std::string read_string_attribute(const std::string& file_path, const std::string& object, const std::string& name) {
  hid_t file = H5Fopen(file_path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t attribute = H5Aopen_by_name(file, object.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT);
  EXPECT_GE(attribute, 0) << object << " " << name;
  hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, H5T_VARIABLE);
  H5Tset_cset(type, H5T_CSET_UTF8);
  char* text = nullptr;
  EXPECT_GE(H5Aread(attribute, type, &text), 0);
  std::string result = text ? text : "";
  H5free_memory(text);
  H5Tclose(type);
  H5Aclose(attribute);
  H5Fclose(file);
  return result;
}
std::vector<double> read_f64_attribute(const std::string& file_path, const std::string& object, const std::string& name) {
  hid_t file = H5Fopen(file_path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t attribute = H5Aopen_by_name(file, object.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT);
  EXPECT_GE(attribute, 0) << object << " " << name;
  hid_t space = H5Aget_space(attribute);
  std::vector<double> values(static_cast<std::size_t>(H5Sget_simple_extent_npoints(space)));
  EXPECT_GE(H5Aread(attribute, H5T_NATIVE_DOUBLE, values.data()), 0);
  H5Sclose(space);
  H5Aclose(attribute);
  H5Fclose(file);
  return values;
}

// Every rank must see the same error; the message names the file.
template <class F>
void expect_error(F&& action, const std::string& path, const std::string& fragment) {
  try {
    action();
    ADD_FAILURE() << "no error (expected '" << fragment << "')";
  } catch (const pulse::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;
    EXPECT_NE(what.find(fragment), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

double loss_at(int step) { return 1.0 / (step + 1); }

void declare_standard(StatsFile& f) {
  f.declare("/steps/loss", SeriesType::float64, 0, "nats", "mean token loss");
  f.declare("/steps/step", SeriesType::int64, 0, "steps", "optimizer step");
  f.declare("/steps/reward", SeriesType::float64, 0, "1", "mean reward (unset on odd steps)");
  f.declare("/kstep/sparsity", SeriesType::float64, 3, "1", "sparsity over k steps");
  f.declare("/steps/counts", SeriesType::int64, 2, "elements", "changed counts");
  f.declare_per_rank("/ranks/seconds", SeriesType::float64, "s", "compute seconds");
  f.declare_per_rank("/ranks/bytes", SeriesType::int64, "B", "bytes sent");
}

StatsRow standard_row(int step, double offset = 0) {
  StatsRow row;
  row.set("/steps/loss", loss_at(step) + offset);
  row.set_int("/steps/step", step);
  if (step % 2 == 0) row.set("/steps/reward", 0.25 * step);
  row.set("/kstep/sparsity", {step + 0.125, step + 0.25, step + 0.5});
  row.set_int("/steps/counts", {std::int64_t(step) * 10, -std::int64_t(step)});
  row.set_rank("/ranks/seconds", rank() + 0.5 * step + offset);
  if (rank() != 1) row.set_rank_int("/ranks/bytes", 1000 * rank() + step);  // rank 1 leaves its column unset
  return row;
}

TEST(StatsFile, ValuesPerRankColumnsAndAttributesRoundTrip) {
  Folder folder;
  const std::string path = folder.path + "/run.h5";
  const int steps = 5;
  {
    StatsFile f(MPI_COMM_WORLD, path, StatsOpen::create);
    f.set_attribute("config", std::string("lr = 1e-6\nsteps = 5"));
    f.set_attribute("ranks", std::int64_t(nranks()));
    f.set_attribute("start_seconds", 12.5);
    f.set_attribute("tensor_names", std::vector<std::string>{"wte", "h.0.attn"});
    f.set_attribute("thresholds", std::vector<double>{1e-8, 1e-6});
    declare_standard(f);
    f.set_dataset_attribute("/kstep/sparsity", "k_values", std::vector<double>{1, 2, 4});
    f.set_dataset_attribute("/kstep/sparsity", "k_labels", std::vector<std::string>{"k1", "k2", "k4"});
    f.set_dataset_attribute("/kstep/sparsity", "note", std::string("fraction unchanged"));
    for (int step = 0; step < steps; ++step) {
      f.append(standard_row(step));
      EXPECT_EQ(f.rows(), step + 1);
    }
  }
  if (rank() == 0) {
    const int n = nranks();
    auto loss = read_dataset(path, "/steps/loss");
    ASSERT_EQ(loss.dims, (std::vector<hsize_t>{steps}));
    auto step_series = read_dataset(path, "/steps/step");
    auto reward = read_dataset(path, "/steps/reward");
    auto sparsity = read_dataset(path, "/kstep/sparsity");
    ASSERT_EQ(sparsity.dims, (std::vector<hsize_t>{steps, 3}));
    auto counts = read_dataset(path, "/steps/counts");
    ASSERT_EQ(counts.dims, (std::vector<hsize_t>{steps, 2}));
    auto seconds = read_dataset(path, "/ranks/seconds");
    ASSERT_EQ(seconds.dims, (std::vector<hsize_t>{steps, hsize_t(n)}));
    auto bytes = read_dataset(path, "/ranks/bytes");
    for (int s = 0; s < steps; ++s) {
      EXPECT_EQ(loss.f64[s], loss_at(s));
      EXPECT_EQ(step_series.i64[s], s);
      if (s % 2 == 0)
        EXPECT_EQ(reward.f64[s], 0.25 * s);
      else
        EXPECT_TRUE(std::isnan(reward.f64[s]));
      for (int j = 0; j < 3; ++j) EXPECT_EQ(sparsity.f64[s * 3 + j], s + 0.125 * (1 << j));
      EXPECT_EQ(counts.i64[s * 2], 10 * s);
      EXPECT_EQ(counts.i64[s * 2 + 1], -s);
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(seconds.f64[s * n + r], r + 0.5 * s) << "step " << s << " rank " << r;
        EXPECT_EQ(bytes.i64[s * n + r], r == 1 ? -1 : 1000 * r + s) << "step " << s << " rank " << r;
      }
    }
    EXPECT_EQ(read_string_attribute(path, "/", "config"), "lr = 1e-6\nsteps = 5");
    EXPECT_EQ(read_f64_attribute(path, "/", "thresholds"), (std::vector<double>{1e-8, 1e-6}));
    EXPECT_EQ(read_f64_attribute(path, "/kstep/sparsity", "k_values"), (std::vector<double>{1, 2, 4}));
    EXPECT_EQ(read_string_attribute(path, "/kstep/sparsity", "note"), "fraction unchanged");
    EXPECT_EQ(read_string_attribute(path, "/ranks/bytes", "units"), "B");
    EXPECT_EQ(read_string_attribute(path, "/steps/loss", "description"), "mean token loss");
    const auto index = nlohmann::json::parse(read_string_attribute(path, "/", "datasets"));
    EXPECT_EQ(index.size(), 7u);
    EXPECT_EQ(index["/ranks/seconds"]["kind"], "per_rank");
    EXPECT_EQ(index["/steps/loss"]["units"], "nats");
    EXPECT_EQ(index["/kstep/sparsity"]["kind"], "per_step");
  }
}

TEST(StatsFile, CreateRefusesAnExistingFileAndLeavesItByteIdentical) {
  Folder folder;
  const std::string path = folder.path + "/existing.h5";
  const std::string original = "not yours\n";
  if (rank() == 0) std::ofstream(path, std::ios::binary) << original;
  MPI_Barrier(MPI_COMM_WORLD);
  expect_error([&] { StatsFile f(MPI_COMM_WORLD, path, StatsOpen::create); }, path, "already exists");
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(file_bytes(path), original);
  // overwrite replaces it with an empty stats file
  {
    StatsFile f(MPI_COMM_WORLD, path, StatsOpen::overwrite);
    EXPECT_EQ(f.rows(), 0);
  }
  if (rank() == 0) EXPECT_GT(H5Fis_hdf5(path.c_str()), 0);
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(StatsFile, ResumeDropsLaterRowsAndContinues) {
  Folder folder;
  const std::string path = folder.path + "/resume.h5";
  {
    StatsFile f(MPI_COMM_WORLD, path, StatsOpen::create);
    declare_standard(f);
    f.write_array("/absorption/step_000002/counts", std::vector<std::int64_t>{1, 2, 3, 4}, {2, 2}, "tensors", "h");
    for (int step = 0; step < 6; ++step) f.append(standard_row(step));
  }
  expect_error([&] { StatsFile f(MPI_COMM_WORLD, path, StatsOpen::resume, 7); }, path, "cannot resume at row 7");
  {
    StatsFile f(MPI_COMM_WORLD, path, StatsOpen::resume, 4);
    EXPECT_EQ(f.rows(), 4);
    declare_standard(f);
    f.declare("/steps/new_metric", SeriesType::float64, 0, "1", "declared after the resume");
    for (int step = 4; step < 7; ++step) {
      StatsRow row = standard_row(step, 100.0);  // different values from the first run
      row.set("/steps/new_metric", step);
      f.append(row);
    }
    EXPECT_EQ(f.rows(), 7);
  }
  if (rank() == 0) {
    const int n = nranks();
    auto loss = read_dataset(path, "/steps/loss");
    ASSERT_EQ(loss.dims, (std::vector<hsize_t>{7}));
    for (int s = 0; s < 7; ++s) EXPECT_EQ(loss.f64[s], loss_at(s) + (s >= 4 ? 100.0 : 0.0)) << s;
    auto seconds = read_dataset(path, "/ranks/seconds");
    ASSERT_EQ(seconds.dims, (std::vector<hsize_t>{7, hsize_t(n)}));
    for (int s = 0; s < 7; ++s)
      for (int r = 0; r < n; ++r) EXPECT_EQ(seconds.f64[s * n + r], r + 0.5 * s + (s >= 4 ? 100.0 : 0.0));
    auto added = read_dataset(path, "/steps/new_metric");
    ASSERT_EQ(added.dims, (std::vector<hsize_t>{7}));
    for (int s = 0; s < 4; ++s) EXPECT_TRUE(std::isnan(added.f64[s]));
    for (int s = 4; s < 7; ++s) EXPECT_EQ(added.f64[s], s);
    EXPECT_EQ(read_dataset(path, "/absorption/step_000002/counts").i64, (std::vector<std::int64_t>{1, 2, 3, 4}));
  }
}

TEST(StatsFile, ResumeRejectsMismatchedSeries) {
  Folder folder;
  const std::string path = folder.path + "/mismatch.h5";
  {
    StatsFile f(MPI_COMM_WORLD, path, StatsOpen::create);
    declare_standard(f);
    f.append(standard_row(0));
  }
  auto resume_and_declare = [&](auto&& declare) {
    return [&, declare] {
      StatsFile f(MPI_COMM_WORLD, path, StatsOpen::resume, 1);
      declare(f);
    };
  };
  expect_error(resume_and_declare([](StatsFile& f) { f.declare("/steps/loss", SeriesType::int64, 0, "", ""); }), path,
               "another type than int64");
  expect_error(resume_and_declare([](StatsFile& f) { f.declare("/kstep/sparsity", SeriesType::float64, 4, "", ""); }),
               path, "has width 3, declared 4");
  expect_error(resume_and_declare([](StatsFile& f) { f.declare("/steps/loss", SeriesType::float64, 2, "", ""); }),
               path, "has width 0, declared 2");
  expect_error(resume_and_declare([](StatsFile& f) { f.declare_per_rank("/steps/loss", SeriesType::float64, "", ""); }),
               path, "is not a per_rank series");
  // the failed attempts changed nothing: the row is still there
  {
    StatsFile f(MPI_COMM_WORLD, path, StatsOpen::resume, 1);
    EXPECT_EQ(f.rows(), 1);
  }
}

TEST(StatsFile, ResumeRejectsFilesThatAreNotPulseStats) {
  Folder folder;
  const std::string text = folder.path + "/text.h5", plain = folder.path + "/plain.h5", missing = folder.path + "/missing.h5";
  if (rank() == 0) {
    std::ofstream(text) << "hello";
    hid_t file = H5Fcreate(plain.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT);
    H5Fclose(file);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  expect_error([&] { StatsFile f(MPI_COMM_WORLD, text, StatsOpen::resume); }, text, "not an HDF5 file");
  expect_error([&] { StatsFile f(MPI_COMM_WORLD, plain, StatsOpen::resume); }, plain, "not a pulse stats file");
  expect_error([&] { StatsFile f(MPI_COMM_WORLD, missing, StatsOpen::resume); }, missing, "does not exist");
}

TEST(StatsFile, UnwritablePathsFailOnEveryRank) {
  Folder scratch;
  const std::string folder = scratch.path;
  const std::string not_a_folder = folder + "/file";
  if (rank() == 0) std::ofstream(not_a_folder) << "x";
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string under_file = not_a_folder + "/stats.h5";
  expect_error([&] { StatsFile f(MPI_COMM_WORLD, under_file, StatsOpen::create); }, under_file, "cannot be written");
  const std::string no_folder = folder + "/no/such/folder/stats.h5";
  expect_error([&] { StatsFile f(MPI_COMM_WORLD, no_folder, StatsOpen::overwrite); }, no_folder, "cannot be written");
  expect_error([&] { StatsFile f(MPI_COMM_WORLD, folder, StatsOpen::overwrite); }, folder, "not a regular file");
}

TEST(StatsFile, AppendRejectsBadRowsOnEveryRankAndWritesNothing) {
  Folder folder;
  const std::string path = folder.path + "/bad_rows.h5";
  StatsFile f(MPI_COMM_WORLD, path, StatsOpen::create);
  declare_standard(f);
  f.append(standard_row(0));
  const int last = nranks() - 1;  // only one rank's row is wrong; all ranks must throw
  {
    StatsRow row = standard_row(1);
    if (rank() == last) row.set("/steps/undeclared", 1.0);
    expect_error([&] { f.append(row); }, path, "/steps/undeclared was not declared");
  }
  {
    StatsRow row = standard_row(1);
    if (rank() == last) row.set("/kstep/sparsity", {1.0, 2.0});
    expect_error([&] { f.append(row); }, path, "has width 3, got 2 values");
  }
  {
    StatsRow row = standard_row(1);
    if (rank() == last) row.set("/ranks/seconds", 1.0);
    expect_error([&] { f.append(row); }, path, "is per-rank, use set_rank");
  }
  {
    StatsRow row = standard_row(1);
    if (rank() == last) row.set("/steps/step", 1.0);
    expect_error([&] { f.append(row); }, path, "/steps/step holds int64");
  }
  expect_error([&] { f.declare("/steps/loss", SeriesType::float64, 0, "", ""); }, path, "declared twice");
  EXPECT_EQ(f.rows(), 1);
  f.append(standard_row(1));
  EXPECT_EQ(f.rows(), 2);
}

// The rows at the path as a reader sees them (rank 0; the file is complete after every flush).
hsize_t rows_on_disk(const std::string& path) { return read_dataset(path, "/steps/loss").dims.at(0); }

TEST(StatsFile, RowsReachThePathAtEachFlushAndOnlyThen) {
  Folder folder;
  const std::string path = folder.path + "/flushes.h5";
  const std::string before_resume = folder.path + "/before_resume.h5";
  {
    StatsFile f(MPI_COMM_WORLD, path, StatsOpen::create);
    expect_error([&] { f.set_flush_interval(0, 1.0); }, path, "need >= 1 row");
    expect_error([&] { f.set_flush_interval(4, 0.0); }, path, "need >= 1 row and > 0 s");
    f.set_flush_interval(4, 1e9);
    declare_standard(f);
    f.flush();
    for (int step = 0; step < 10; ++step) {
      f.append(standard_row(step));
      EXPECT_EQ(f.flushed_rows(), step + 1 >= 8 ? 8 : step + 1 >= 4 ? 4 : 0) << step;
      MPI_Barrier(MPI_COMM_WORLD);
      if (rank() == 0) EXPECT_EQ(rows_on_disk(path), hsize_t(f.flushed_rows())) << step;
      MPI_Barrier(MPI_COMM_WORLD);
    }
    f.flush();
    EXPECT_EQ(f.flushed_rows(), 10);
    if (rank() == 0) EXPECT_EQ(rows_on_disk(path), 10u);
    // a time limit flushes on the next append although the row limit is far
    f.set_flush_interval(1000, 1e-9);
    f.append(standard_row(10));
    EXPECT_EQ(f.flushed_rows(), 11);
    f.set_flush_interval(1000, 1e9);
    f.append(standard_row(11));
    EXPECT_EQ(f.flushed_rows(), 11);
  }  // destruction flushes the rest
  if (rank() == 0) {
    EXPECT_EQ(rows_on_disk(path), 12u);
    std::filesystem::copy_file(path, before_resume);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  {
    // resume changes the path only at its first flush: a run killed before it finds the old file
    StatsFile f(MPI_COMM_WORLD, path, StatsOpen::resume, 5);
    declare_standard(f);
    f.append(standard_row(5, 100.0));
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank() == 0) EXPECT_EQ(file_bytes(path), file_bytes(before_resume));
    f.flush();
    if (rank() == 0) {
      EXPECT_EQ(rows_on_disk(path), 6u);
      EXPECT_EQ(read_dataset(path, "/steps/loss").f64[5], loss_at(5) + 100.0);
    }
  }
}

TEST(StatsFile, WriteArrayRoundTripsAndReplaces) {
  Folder folder;
  const std::string path = folder.path + "/arrays.h5";
  {
    StatsFile f(MPI_COMM_WORLD, path, StatsOpen::create);
    // only rank 0's data counts; the others pass nothing
    const std::vector<double> ratio = rank() == 0 ? std::vector<double>{0.5, 1.5, 2.5, 3.5, 4.5, 5.5} : std::vector<double>{};
    f.write_array("/absorption/step_000010/ratio_counts", ratio, {2, 3}, "1", "ratio histogram");
    f.write_array("/absorption/step_000010/bins", std::vector<std::int64_t>{7, 8, 9}, {3}, "ulp", "bin edges");
    f.write_array("/absorption/step_000010/bins", std::vector<std::int64_t>{1, 2}, {2}, "ulp", "bin edges, again");
    const std::vector<double> wrong = rank() == 0 ? std::vector<double>{1.0} : std::vector<double>{};
    expect_error([&] { f.write_array("/absorption/bad", wrong, {2}, "", ""); }, path, "has 1 values for 2 elements");
  }
  if (rank() == 0) {
    auto ratio = read_dataset(path, "/absorption/step_000010/ratio_counts");
    EXPECT_EQ(ratio.dims, (std::vector<hsize_t>{2, 3}));
    EXPECT_EQ(ratio.f64, (std::vector<double>{0.5, 1.5, 2.5, 3.5, 4.5, 5.5}));
    auto bins = read_dataset(path, "/absorption/step_000010/bins");
    EXPECT_EQ(bins.i64, (std::vector<std::int64_t>{1, 2}));
    EXPECT_EQ(read_string_attribute(path, "/absorption/step_000010/bins", "description"), "bin edges, again");
    const auto index = nlohmann::json::parse(read_string_attribute(path, "/", "datasets"));
    EXPECT_EQ(index["/absorption/step_000010/ratio_counts"]["kind"], "array");
    EXPECT_FALSE(index.contains("/absorption/bad"));
  }
}

}  // namespace
