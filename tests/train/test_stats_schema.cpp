// The statistics schema (src/train/stats_schema): a file declared from it lists exactly the
// schema's series with the schema's units, descriptions, widths and column attributes; arrays land
// under the step's name; the Markdown table has one row per dataset.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>
#include <stdlib.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.hpp"
#include "train/stats_schema.hpp"
#include "train/train_config.hpp"

using namespace pulse;

namespace {

int rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

std::string shared_folder() {
  std::string path;
  if (rank() == 0) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp ? tmp : "/tmp") + "/pulse_schema_XXXXXX";
    path = mkdtemp(pattern.data()) ? pattern : "";
  }
  int length = int(path.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
  path.resize(length);
  MPI_Bcast(path.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD);
  return path;
}

std::string string_attribute(hid_t object, const std::string& name) {
  hid_t attribute = H5Aopen(object, name.c_str(), H5P_DEFAULT);
  EXPECT_GE(attribute, 0) << name;
  hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, H5T_VARIABLE);
  H5Tset_cset(type, H5T_CSET_UTF8);
  char* text = nullptr;
  EXPECT_GE(H5Aread(attribute, type, &text), 0);
  std::string out = text ? text : "";
  H5free_memory(text);
  H5Tclose(type);
  H5Aclose(attribute);
  return out;
}

std::vector<hsize_t> dims_of(hid_t file, const std::string& path) {
  hid_t dataset = H5Dopen2(file, path.c_str(), H5P_DEFAULT);
  EXPECT_GE(dataset, 0) << path;
  hid_t space = H5Dget_space(dataset);
  std::vector<hsize_t> dims(H5Sget_simple_extent_ndims(space));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  H5Sclose(space);
  H5Dclose(dataset);
  return dims;
}

bool has_attribute(hid_t file, const std::string& path, const std::string& name) {
  return H5Aexists_by_name(file, path.c_str(), name.c_str(), H5P_DEFAULT) > 0;
}

}  // namespace

TEST(StatsSchema, PathsAreUniqueAndLookedUp) {
  std::set<std::string> paths;
  for (const StatsColumn& c : train_stats_schema()) {
    EXPECT_TRUE(paths.insert(c.path).second) << c.path << " twice";
    EXPECT_EQ(&stats_column(c.path), &c);
    EXPECT_FALSE(c.units.empty()) << c.path;
    EXPECT_FALSE(c.description.empty()) << c.path;
  }
  EXPECT_THROW(stats_column("/steps/no_such_series"), Error);
  EXPECT_EQ(stats_array_path("/absorption/step_NNNNNN/absorbed", 42), "/absorption/step_000042/absorbed");
  EXPECT_THROW(stats_array_path("/steps/loss", 1), Error);
}

TEST(StatsSchema, DeclaredFileListsExactlyTheSchema) {
  const std::string folder = shared_folder();
  ASSERT_FALSE(folder.empty());
  const std::string path = folder + "/schema.h5";
  const std::vector<std::string> tensors = {"wte", "h0.attn.w", "lm_head"};
  int nranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  {
    io::StatsFile file(MPI_COMM_WORLD, path, io::StatsOpen::create);
    declare_train_statistics(file, train_column_values(tensors));
    io::StatsRow row;
    row.set_int("/steps/step", 1);
    file.append(row);
    write_stats_array(file, "/absorption/step_NNNNNN/absorbed", 7, {rank() == 0 ? 5 : 0});
    file.flush();
  }
  if (rank() == 0) {
    hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(file, 0);
    const nlohmann::json index = nlohmann::json::parse(string_attribute(file, "datasets"));
    std::set<std::string> expected;
    for (const StatsColumn& c : train_stats_schema()) {
      const std::string stored = c.kind == StatsKind::array ? stats_array_path(c.path, 7) : c.path;
      if (c.kind == StatsKind::array && c.path.find("absorbed") == std::string::npos) continue;  // not written
      expected.insert(stored);
      ASSERT_TRUE(index.contains(stored)) << stored;
      EXPECT_EQ(index[stored]["units"], c.units) << stored;
      EXPECT_EQ(index[stored]["description"], c.description) << stored;
      const std::vector<hsize_t> dims = dims_of(file, stored);
      if (c.kind == StatsKind::array) {
        EXPECT_EQ(dims, std::vector<hsize_t>{1});
        continue;
      }
      EXPECT_EQ(dims[0], 1u) << stored;  // one row appended
      const std::string attribute = columns_attribute(c.columns);
      if (c.kind == StatsKind::per_rank) EXPECT_EQ(dims, (std::vector<hsize_t>{1, hsize_t(nranks)})) << stored;
      else if (c.columns == StatsColumns::none) EXPECT_EQ(dims.size(), 1u) << stored;
      else EXPECT_TRUE(has_attribute(file, stored, attribute)) << stored << " lacks " << attribute;
    }
    EXPECT_EQ(dims_of(file, "/steps/tensor_changed"), (std::vector<hsize_t>{1, tensors.size()}));
    EXPECT_EQ(dims_of(file, "/kstep/sparsity"), (std::vector<hsize_t>{1, kstep_values.size()}));
    EXPECT_EQ(dims_of(file, "/steps/grad_sparsity"), (std::vector<hsize_t>{1, grad_thresholds.size()}));
    EXPECT_EQ(dims_of(file, "/steps/adam_ratio"), (std::vector<hsize_t>{1, adam_quantiles.size()}));
    std::set<std::string> stored;
    for (const auto& item : index.items()) stored.insert(item.key());
    EXPECT_EQ(stored, expected);
    H5Fclose(file);
    std::filesystem::remove_all(folder);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(StatsSchema, MarkdownHasOneRowPerDataset) {
  const std::string table = stats_schema_markdown();
  std::istringstream lines(table);
  std::vector<std::string> rows;
  for (std::string line; std::getline(lines, line);) rows.push_back(line);
  ASSERT_EQ(rows.size(), train_stats_schema().size() + 2);  // header and separator
  for (std::size_t i = 0; i < train_stats_schema().size(); ++i) {
    const StatsColumn& c = train_stats_schema()[i];
    const std::string& row = rows[i + 2];
    EXPECT_EQ(row.rfind("| `" + c.path + "` | " + stats_shape(c) + " |", 0), 0u) << row;
    // five cells: a '|' inside a description ("|g|") is escaped
    std::size_t cells = 0;
    for (std::size_t k = 0; k < row.size(); ++k)
      if (row[k] == '|' && (k == 0 || row[k - 1] != '\\')) ++cells;
    EXPECT_EQ(cells, 6u) << row;
  }
  EXPECT_NE(table.find("| `/steps/tensor_changed` | (steps, tensors) | int64 | elements |"), std::string::npos);
}
