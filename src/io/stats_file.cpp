#include "io/stats_file.hpp"

#include <dirent.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "core/agreed_error.hpp"
#include "core/atomic_file.hpp"
#include "core/error.hpp"

namespace pulse::io {

namespace {

constexpr std::int64_t format_version = 1;
constexpr hsize_t chunk_rows = 256;
constexpr std::size_t core_increment = 1 << 20;  // the in-memory file grows by 1 MiB steps
const char* const format_attribute = "pulse_stats_format";
const char* const index_attribute = "datasets";

// One hid_t and the H5*close that releases it.
class Handle {
 public:
  Handle() = default;
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Handle(Handle&& other) noexcept : id_(std::exchange(other.id_, H5I_INVALID_HID)), close_(other.close_) {}
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      reset();
      id_ = std::exchange(other.id_, H5I_INVALID_HID);
      close_ = other.close_;
    }
    return *this;
  }
  ~Handle() { reset(); }
  hid_t get() const { return id_; }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  herr_t (*close_)(hid_t) = nullptr;
};

// HDF5 prints its error stack to stderr by default; pulse reports one line instead.
class QuietHdf5 {
 public:
  QuietHdf5() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietHdf5() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

// The innermost message of HDF5's error stack, which names the actual cause (errno text etc.).
std::string hdf5_reason() {
  std::string reason;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* e, void* out) -> herr_t {
        if (e->desc && *e->desc) *static_cast<std::string*>(out) = e->desc;
        return 0;
      },
      &reason);
  H5Eclear2(H5E_DEFAULT);
  for (char& c : reason)
    if (c == '\n') c = ' ';
  return reason.empty() ? "unknown HDF5 error" : reason;
}

hid_t memory_type(SeriesType type) { return type == SeriesType::float64 ? H5T_NATIVE_DOUBLE : H5T_NATIVE_INT64; }
hid_t file_type(SeriesType type) { return type == SeriesType::float64 ? H5T_IEEE_F64LE : H5T_STD_I64LE; }
const char* type_name(SeriesType type) { return type == SeriesType::float64 ? "float64" : "int64"; }
constexpr double fill_f64 = std::numeric_limits<double>::quiet_NaN();
constexpr std::int64_t fill_i64 = -1;

std::string parent_folder(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Why `path` cannot be opened in `mode`, or "" if it looks fine. Runs on one rank only.
std::string precheck(const std::string& path, StatsOpen mode) {
  struct stat info {};
  const bool exists = ::stat(path.c_str(), &info) == 0;
  if (mode == StatsOpen::create && exists) return "already exists (choose overwrite or resume)";
  if (mode == StatsOpen::resume) {
    if (!exists) return "does not exist, nothing to resume";
    if (!S_ISREG(info.st_mode)) return "is not a regular file";  // opening a FIFO would block
    if (H5Fis_hdf5(path.c_str()) <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return "is not an HDF5 file";
    }
    return "";
  }
  if (exists && !S_ISREG(info.st_mode)) return "is not a regular file";
  const std::string folder = parent_folder(path);
  struct stat folder_info {};
  if (::stat(folder.c_str(), &folder_info) != 0) return "cannot be written: folder " + folder + ": " + std::strerror(errno);
  if (!S_ISDIR(folder_info.st_mode)) return "cannot be written: " + folder + " is not a folder";
  if (::access(folder.c_str(), W_OK) != 0) return "cannot be written: folder " + folder + ": " + std::strerror(errno);
  return "";
}

// Removes PATH.tmp.* left by a writer killed inside a flush (AtomicFile names its temporaries so).
void remove_stale_temporaries(const std::string& path) {
  const auto slash = path.rfind('/');
  const std::string folder = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const std::string prefix = (slash == std::string::npos ? path : path.substr(slash + 1)) + ".tmp.";
  DIR* dir = ::opendir(folder.c_str());
  if (!dir) return;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.size() == prefix.size() + 6 && name.compare(0, prefix.size(), prefix) == 0)
      ::unlink((folder + "/" + name).c_str());
  }
  ::closedir(dir);
}

}  // namespace

// ---- StatsRow ----

void StatsRow::set(const std::string& path, double value) {
  values_[path] = Value{SeriesType::float64, false, true, {value}, {}};
}
void StatsRow::set(const std::string& path, const std::vector<double>& values) {
  values_[path] = Value{SeriesType::float64, false, false, values, {}};
}
void StatsRow::set_int(const std::string& path, std::int64_t value) {
  values_[path] = Value{SeriesType::int64, false, true, {}, {value}};
}
void StatsRow::set_int(const std::string& path, const std::vector<std::int64_t>& values) {
  values_[path] = Value{SeriesType::int64, false, false, {}, values};
}
void StatsRow::set_rank(const std::string& path, double value) {
  values_[path] = Value{SeriesType::float64, true, true, {value}, {}};
}
void StatsRow::set_rank_int(const std::string& path, std::int64_t value) {
  values_[path] = Value{SeriesType::int64, true, true, {}, {value}};
}

// ---- StatsFile ----

struct Series {
  std::string path;
  SeriesType type;
  bool per_rank;
  int width;  // 0: one value per row; per-rank series: the rank count
  Handle dataset;  // rank 0 only
  // Rank 0: rows appended since the last flush, row-major, columns() values per row.
  std::vector<double> pending_f64;
  std::vector<std::int64_t> pending_i64;
  std::size_t columns() const { return width == 0 ? 1 : std::size_t(width); }
};

struct StatsFile::Impl {
  using Clock = std::chrono::steady_clock;
  std::string path;
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  Handle file;  // rank 0 only; declared before `series`, so datasets close first
  std::vector<Series> series;
  nlohmann::json index = nlohmann::json::object();  // rank 0
  bool index_dirty = false;  // the "datasets" attribute lags `index` until the next flush
  std::int64_t stored_rows = 0;  // rank 0: rows in the in-memory datasets (the rest are pending)
  std::int64_t pending_rows = 0;  // rank 0
  std::int64_t flush_rows = default_flush_rows;
  double flush_seconds = default_flush_seconds;
  Clock::time_point last_flush = Clock::now();
  bool changed = false;  // rank 0: the in-memory file differs from the one at the path

  explicit Impl(MPI_Comm c, std::string p) : path(std::move(p)) {
    MPI_Comm_dup(c, &comm);
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
  }
  ~Impl() {
    series.clear();
    file.reset();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }

  std::string problem(const std::string& what) const { return "stats file " + path + ": " + what; }
  [[noreturn]] void fail(const std::string& what) const { throw Error(problem(what)); }
  hid_t id(hid_t handle, const std::string& what) const {
    if (handle < 0) fail(what + " failed (" + hdf5_reason() + ")");
    return handle;
  }
  void ok(herr_t rc, const std::string& what) const {
    if (rc < 0) fail(std::string(what) + " failed (" + hdf5_reason() + ")");
  }

  // Throws the same error on every rank if any rank has one (the lowest such rank's message, which
  // is a whole error line). `value` is max-reduced along the way (one collective for both).
  void agree(const std::string& local_error, std::int64_t* value = nullptr) const {
    std::int64_t both[2] = {local_error.empty() ? size : rank, value ? -*value : 0};  // min of -v = -max
    MPI_Allreduce(MPI_IN_PLACE, both, 2, MPI_INT64_T, MPI_MIN, comm);
    if (value) *value = -both[1];
    const int first = int(both[0]);
    if (first == size) return;
    std::string message = local_error;
    int length = static_cast<int>(message.size());
    MPI_Bcast(&length, 1, MPI_INT, first, comm);
    message.resize(length);
    MPI_Bcast(message.data(), length, MPI_CHAR, first, comm);
    throw AgreedError(message);
  }
  // Runs `action` on rank 0 (the only rank holding the file); its error is thrown on every rank.
  template <class Action>
  void on_root(Action&& action) {
    std::string error;
    if (rank == 0) {
      try {
        QuietHdf5 quiet;
        changed = true;
        action();
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    agree(error);
  }

  // True if every link along the path exists (H5Lexists alone fails on a missing group).
  bool exists(const std::string& object) const {
    std::size_t pos = 0;
    while (pos != std::string::npos) {
      pos = object.find('/', pos + 1);
      const std::string prefix = object.substr(0, pos);
      const htri_t found = H5Lexists(file.get(), prefix.c_str(), H5P_DEFAULT);
      if (found < 0) ok(found, "H5Lexists " + prefix);
      if (found == 0) return false;
    }
    return true;
  }

  // One attribute writer for every type: dims empty -> scalar; an existing attribute is replaced.
  void write_attribute(hid_t object, const std::string& name, hid_t mem_type, hid_t stored_type,
                       const std::vector<hsize_t>& dims, const void* data) const {
    if (H5Aexists(object, name.c_str()) > 0) ok(H5Adelete(object, name.c_str()), "H5Adelete");
    Handle space(id(dims.empty() ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, dims.data(), nullptr),
                       "H5Screate for attribute " + name),
                 H5Sclose);
    Handle attribute(id(H5Acreate2(object, name.c_str(), stored_type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                           "H5Acreate attribute " + name),
                     H5Aclose);
    ok(H5Awrite(attribute.get(), mem_type, data), "H5Awrite");
  }
  void write_strings(hid_t object, const std::string& name, const std::vector<std::string>& values, bool scalar) const {
    Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(type.get(), H5T_VARIABLE);
    H5Tset_cset(type.get(), H5T_CSET_UTF8);
    std::vector<const char*> pointers;
    for (const auto& v : values) pointers.push_back(v.c_str());
    write_attribute(object, name, type.get(), type.get(), scalar ? std::vector<hsize_t>{} : std::vector<hsize_t>{values.size()},
                    pointers.data());
  }
  std::string read_string_attribute(hid_t object, const std::string& name) const {
    Handle attribute(id(H5Aopen(object, name.c_str(), H5P_DEFAULT), "H5Aopen " + name), H5Aclose);
    Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(type.get(), H5T_VARIABLE);
    H5Tset_cset(type.get(), H5T_CSET_UTF8);
    char* text = nullptr;
    ok(H5Aread(attribute.get(), type.get(), &text), "H5Aread");
    std::string result = text ? text : "";
    H5free_memory(text);
    return result;
  }
  void write_index() {
    write_strings(file.get(), index_attribute, {index.dump()}, true);
    index_dirty = false;
  }
  void describe(hid_t dataset, const std::string& object, const char* kind, const std::string& units,
                const std::string& description) {
    write_strings(dataset, "units", {units}, true);
    write_strings(dataset, "description", {description}, true);
    index[object] = {{"kind", kind}, {"units", units}, {"description", description}};
    index_dirty = true;
  }

  std::vector<hsize_t> extent(hid_t dataset) const {
    Handle space(id(H5Dget_space(dataset), "H5Dget_space"), H5Sclose);
    std::vector<hsize_t> dims(H5Sget_simple_extent_ndims(space.get()));
    H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    return dims;
  }

  // Writes `count` elements at `start` of `dataset` (the one hyperslab writer).
  void write_block(hid_t dataset, hid_t mem_type, const std::vector<hsize_t>& start, const std::vector<hsize_t>& count,
                   const void* data) const {
    Handle file_space(id(H5Dget_space(dataset), "H5Dget_space"), H5Sclose);
    Handle memory_space(id(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr), "H5Screate"),
                        H5Sclose);
    ok(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr),
       "H5Sselect_hyperslab");
    ok(H5Dwrite(dataset, mem_type, memory_space.get(), file_space.get(), H5P_DEFAULT, data), "H5Dwrite");
  }

  Series* find(const std::string& object) {
    for (auto& s : series)
      if (s.path == object) return &s;
    return nullptr;
  }

  // Rank 0: opens or creates the dataset of a series; throws if an existing one does not match.
  Handle open_series(const std::string& object, SeriesType type, bool per_rank, int width, std::int64_t rows,
                     const std::string& units, const std::string& description) {
    const char* kind = per_rank ? "per_rank" : "per_step";
    const std::vector<hsize_t> row_shape = width == 0 ? std::vector<hsize_t>{} : std::vector<hsize_t>{hsize_t(width)};
    Handle dataset;
    if (exists(object)) {
      const auto entry = index.find(object);
      if (entry == index.end() || (*entry)["kind"] != kind)
        fail(object + " exists but is not a " + kind + " series");
      dataset = Handle(id(H5Dopen2(file.get(), object.c_str(), H5P_DEFAULT), "H5Dopen " + object), H5Dclose);
      Handle stored(id(H5Dget_type(dataset.get()), "H5Dget_type"), H5Tclose);
      const bool type_matches = type == SeriesType::float64
                                    ? H5Tget_class(stored.get()) == H5T_FLOAT && H5Tget_size(stored.get()) == 8
                                    : H5Tget_class(stored.get()) == H5T_INTEGER && H5Tget_size(stored.get()) == 8;
      if (!type_matches) fail(object + " holds another type than " + type_name(type));
      const auto dims = extent(dataset.get());
      const std::vector<hsize_t> stored_row(dims.begin() + 1, dims.end());
      if (stored_row != row_shape) {
        const std::string have = stored_row.empty() ? "0" : std::to_string(stored_row[0]);
        fail(object + (per_rank ? " was written by " + have + " ranks, this run has " + std::to_string(width)
                                : " has width " + have + ", declared " + std::to_string(width)));
      }
      if (dims[0] != hsize_t(rows)) fail(object + " has " + std::to_string(dims[0]) + " rows, expected " + std::to_string(rows));
    } else {
      std::vector<hsize_t> dims{hsize_t(rows)}, max_dims{H5S_UNLIMITED}, chunk{chunk_rows};
      for (hsize_t w : row_shape) {
        dims.push_back(w);
        max_dims.push_back(w);
        chunk.push_back(w);
      }
      Handle space(id(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), max_dims.data()), "H5Screate"),
                   H5Sclose);
      Handle create(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
      ok(H5Pset_chunk(create.get(), static_cast<int>(chunk.size()), chunk.data()), "H5Pset_chunk");
      const void* fill = type == SeriesType::float64 ? static_cast<const void*>(&fill_f64) : &fill_i64;
      ok(H5Pset_fill_value(create.get(), memory_type(type), fill), "H5Pset_fill_value");
      dataset = create_dataset(object, file_type(type), space.get(), create.get());
    }
    describe(dataset.get(), object, kind, units, description);
    return dataset;
  }

  void declare(const std::string& object, SeriesType type, bool per_rank, int width, std::int64_t rows,
               const std::string& units, const std::string& description) {
    if (find(object)) fail(object + " is declared twice");
    if (width < 0) fail(object + ": negative width " + std::to_string(width));
    Handle dataset;
    on_root([&] {
      write_pending();  // the series declared now starts after the rows already appended
      dataset = open_series(object, type, per_rank, width, rows, units, description);
    });
    series.push_back(Series{object, type, per_rank, width, std::move(dataset), {}, {}});
  }

  Handle create_dataset(const std::string& object, hid_t type, hid_t space, hid_t create) const {
    Handle links(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
    H5Pset_create_intermediate_group(links.get(), 1);
    return Handle(id(H5Dcreate2(file.get(), object.c_str(), type, space, links.get(), create, H5P_DEFAULT),
                        "H5Dcreate " + object),
                  H5Dclose);
  }

  // Why `row` does not fit the declared series, or "".
  std::string validate(const StatsRow& row) {
    for (const auto& [object, value] : row.values()) {
      const Series* s = find(object);
      if (!s) return problem("append: " + object + " was not declared");
      if (s->per_rank != value.per_rank)
        return problem("append: " + object + (s->per_rank ? " is per-rank, use set_rank" : " is per-step, use set"));
      if (s->type != value.type) return problem("append: " + object + " holds " + type_name(s->type));
      const std::size_t count = value.type == SeriesType::float64 ? value.f64.size() : value.i64.size();
      const int expected = s->per_rank ? 0 : s->width;
      if (value.scalar != (expected == 0) || (!value.scalar && count != std::size_t(expected)))
        return problem("append: " + object + " has width " + std::to_string(expected) + ", got " +
                       (value.scalar ? "a scalar" : std::to_string(count) + " values"));
    }
    return "";
  }

  // Rank 0 gathers every rank's per-rank values (8 bytes each, unset ones as the fill value, then
  // a flag for a row that does not fit) and buffers the row; the file changes only at a flush.
  // Returns the rows flushed to the path if this append flushed, else -1.
  std::int64_t append(const StatsRow& row) {
    const std::string invalid = validate(row);
    std::vector<std::int64_t> mine;
    for (const Series& s : series) {
      if (!s.per_rank) continue;
      const auto it = row.values().find(s.path);
      const bool set = invalid.empty() && it != row.values().end();
      std::int64_t bits = fill_i64;
      if (s.type == SeriesType::float64) std::memcpy(&bits, set ? &it->second.f64[0] : &fill_f64, sizeof bits);
      else if (set) bits = it->second.i64[0];
      mine.push_back(bits);
    }
    mine.push_back(invalid.empty() ? 0 : 1);
    const std::size_t per_rank = mine.size();
    std::vector<std::int64_t> all(rank == 0 ? per_rank * std::size_t(size) : 0);
    MPI_Gather(mine.data(), int(per_rank), MPI_INT64_T, all.data(), int(per_rank), MPI_INT64_T, 0, comm);
    std::string error = invalid;
    std::int64_t flushed = -1;
    bool every_row_fits = true;
    for (int r = 0; r < (rank == 0 ? size : 0); ++r) every_row_fits &= all[std::size_t(r + 1) * per_rank - 1] == 0;
    if (rank == 0 && every_row_fits) {
      try {
        QuietHdf5 quiet;
        buffer_row(row, all, per_rank);
        if (pending_rows >= flush_rows || seconds_since_flush() >= flush_seconds) flushed = flush_now();
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    agree(error, &flushed);
    return flushed;
  }

  void buffer_row(const StatsRow& row, const std::vector<std::int64_t>& gathered, std::size_t per_rank_count) {
    std::size_t column = 0;  // index of the series among the per-rank ones
    for (Series& s : series) {
      if (s.per_rank) {
        for (int r = 0; r < size; ++r) {
          const std::int64_t bits = gathered[std::size_t(r) * per_rank_count + column];
          if (s.type == SeriesType::float64) {
            double value;
            std::memcpy(&value, &bits, sizeof value);
            s.pending_f64.push_back(value);
          } else {
            s.pending_i64.push_back(bits);
          }
        }
        ++column;
        continue;
      }
      const auto it = row.values().find(s.path);
      const StatsRow::Value* value = it == row.values().end() ? nullptr : &it->second;
      if (s.type == SeriesType::float64) {
        if (value) s.pending_f64.insert(s.pending_f64.end(), value->f64.begin(), value->f64.end());
        else s.pending_f64.resize(s.pending_f64.size() + s.columns(), fill_f64);
      } else {
        if (value) s.pending_i64.insert(s.pending_i64.end(), value->i64.begin(), value->i64.end());
        else s.pending_i64.resize(s.pending_i64.size() + s.columns(), fill_i64);
      }
    }
    ++pending_rows;
    changed = true;
  }

  double seconds_since_flush() const { return std::chrono::duration<double>(Clock::now() - last_flush).count(); }

  // Rank 0: moves the buffered rows into the in-memory datasets.
  void write_pending() {
    if (pending_rows == 0) return;
    const hsize_t start = hsize_t(stored_rows), count = hsize_t(pending_rows);
    for (Series& s : series) {
      std::vector<hsize_t> dims{start + count}, offset{start}, block{count};
      if (s.width > 0) {
        dims.push_back(hsize_t(s.width));
        offset.push_back(0);
        block.push_back(hsize_t(s.width));
      }
      ok(H5Dset_extent(s.dataset.get(), dims.data()), "H5Dset_extent " + s.path);
      const void* data = s.type == SeriesType::float64 ? static_cast<const void*>(s.pending_f64.data()) : s.pending_i64.data();
      write_block(s.dataset.get(), memory_type(s.type), offset, block, data);
      s.pending_f64.clear();
      s.pending_i64.clear();
    }
    stored_rows += pending_rows;
    pending_rows = 0;
  }

  // Rank 0: writes the whole file to the path atomically; returns the rows it holds.
  std::int64_t flush_now() {
    if (!changed) return stored_rows;
    write_pending();
    if (index_dirty) write_index();
    ok(H5Fflush(file.get(), H5F_SCOPE_LOCAL), "H5Fflush");  // the metadata cache into the image
    const ssize_t size_needed = H5Fget_file_image(file.get(), nullptr, 0);
    if (size_needed < 0) ok(-1, "H5Fget_file_image");
    std::vector<char> image(static_cast<std::size_t>(size_needed));
    if (H5Fget_file_image(file.get(), image.data(), image.size()) != size_needed) ok(-1, "H5Fget_file_image");
    try {
      write_file_atomically(path, image.data(), image.size());
    } catch (const Error& e) {
      fail(std::string("flush failed: ") + e.what());
    }
    last_flush = Clock::now();
    changed = false;
    return stored_rows;
  }

  void write_array(const std::string& object, hid_t mem_type, hid_t stored_type, const void* data, std::size_t count,
                   const std::vector<std::int64_t>& dims, const std::string& units, const std::string& description) {
    if (find(object)) fail("write_array: " + object + " is a series");
    std::vector<hsize_t> shape;
    std::size_t elements = 1;
    for (auto d : dims) {
      if (d <= 0) fail("write_array: " + object + " has a dimension " + std::to_string(d) + " (must be positive)");
      shape.push_back(hsize_t(d));
      elements *= std::size_t(d);
    }
    if (dims.empty()) fail("write_array: " + object + " has no dimensions");
    on_root([&] {
      if (count != elements)
        fail("write_array: " + object + " has " + std::to_string(count) + " values for " + std::to_string(elements) +
             " elements");
      if (exists(object)) ok(H5Ldelete(file.get(), object.c_str(), H5P_DEFAULT), "H5Ldelete " + object);
      Handle space(id(H5Screate_simple(static_cast<int>(shape.size()), shape.data(), nullptr), "H5Screate"), H5Sclose);
      Handle dataset = create_dataset(object, stored_type, space.get(), H5P_DEFAULT);
      write_block(dataset.get(), mem_type, std::vector<hsize_t>(shape.size(), 0), shape, data);
      describe(dataset.get(), object, "array", units, description);
    });
  }

  hid_t object(const std::string& target) const {
    if (!exists(target)) fail(target + " does not exist");
    return id(H5Oopen(file.get(), target.c_str(), H5P_DEFAULT), "H5Oopen " + target);
  }
  void set_dataset_attribute(const std::string& target, const std::function<void(hid_t)>& write) {
    on_root([&] {
      Handle handle(object(target), H5Oclose);
      write(handle.get());
    });
  }

  // Rank 0: the file in memory (the core driver, no backing store: only flushes touch the path).
  void open(StatsOpen mode, std::int64_t keep_rows) {
    Handle access(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    ok(H5Pset_fapl_core(access.get(), core_increment, 0), "H5Pset_fapl_core");
    if (mode != StatsOpen::resume) {
      file = Handle(id(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access.get()), "H5Fcreate"), H5Fclose);
      write_attribute(file.get(), format_attribute, H5T_NATIVE_INT64, H5T_STD_I64LE, {}, &format_version);
      write_index();
      return;
    }
    file = Handle(id(H5Fopen(path.c_str(), H5F_ACC_RDWR, access.get()), "H5Fopen"), H5Fclose);
    if (H5Aexists(file.get(), format_attribute) <= 0)
      fail("is not a pulse stats file (no " + std::string(format_attribute) + " attribute)");
    std::int64_t version = 0;
    {
      Handle attribute(id(H5Aopen(file.get(), format_attribute, H5P_DEFAULT), "H5Aopen"), H5Aclose);
      ok(H5Aread(attribute.get(), H5T_NATIVE_INT64, &version), "H5Aread");
    }
    if (version != format_version)
      fail("has format version " + std::to_string(version) + ", this pulse reads " + std::to_string(format_version));
    try {
      index = nlohmann::json::parse(read_string_attribute(file.get(), index_attribute));
    } catch (const nlohmann::json::exception& e) {
      fail(std::string("its datasets attribute is not JSON: ") + e.what());
    }
    // Drop the rows the resumed run recomputes, on every series the file holds.
    for (const auto& item : index.items()) {
      const std::string& object = item.key();
      if (item.value().value("kind", "") == "array") continue;
      Handle dataset(id(H5Dopen2(file.get(), object.c_str(), H5P_DEFAULT), "H5Dopen " + object), H5Dclose);
      auto dims = extent(dataset.get());
      if (dims.empty() || dims[0] < hsize_t(keep_rows))
        fail(object + " has " + (dims.empty() ? "no" : std::to_string(dims[0])) + " rows, cannot resume at row " +
             std::to_string(keep_rows));
      dims[0] = hsize_t(keep_rows);
      ok(H5Dset_extent(dataset.get(), dims.data()), "H5Dset_extent");
    }
    stored_rows = keep_rows;
  }
};

StatsFile::StatsFile(MPI_Comm comm, const std::string& path, StatsOpen mode, std::int64_t keep_rows)
    : impl_(std::make_unique<Impl>(comm, path)), path_(path) {
  Impl& f = *impl_;
  if (keep_rows < 0 || (mode != StatsOpen::resume && keep_rows != 0))
    f.fail("keep_rows " + std::to_string(keep_rows) + " is only meaningful (and >= 0) for resume");
  // One rank looks at the file system, so every rank gets the same verdict.
  f.on_root([&] {
    const std::string problem = precheck(path, mode);
    if (!problem.empty()) f.fail(problem);
    remove_stale_temporaries(path);
    f.open(mode, keep_rows);
  });
  rows_ = keep_rows;
  if (mode == StatsOpen::resume) {
    flushed_rows_ = keep_rows;  // the path holds at least these rows
  } else {
    flush();  // the path is a (still empty) stats file from now on
  }
}

StatsFile::~StatsFile() {
  // Not collective (a destructor may run on one rank only, while an error unwinds): rank 0 writes
  // what is left; an error here can only be reported.
  if (impl_->rank == 0 && impl_->file.get() >= 0) {
    try {
      QuietHdf5 quiet;
      impl_->flush_now();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
    }
  }
  impl_.reset();
}

void StatsFile::flush() {
  std::int64_t flushed = -1;
  std::string error;
  if (impl_->rank == 0) {
    try {
      QuietHdf5 quiet;
      flushed = impl_->flush_now();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  impl_->agree(error, &flushed);
  flushed_rows_ = flushed;
}

void StatsFile::set_flush_interval(std::int64_t rows, double seconds) {
  if (rows < 1 || !(seconds > 0))
    impl_->fail("flush interval of " + std::to_string(rows) + " rows or " + std::to_string(seconds) +
                " s (need >= 1 row and > 0 s)");
  impl_->flush_rows = rows;
  impl_->flush_seconds = seconds;
}

void StatsFile::set_attribute(const std::string& name, const std::string& value) {
  impl_->on_root([&] { impl_->write_strings(impl_->file.get(), name, {value}, true); });
}
void StatsFile::set_attribute(const std::string& name, std::int64_t value) {
  impl_->on_root([&] { impl_->write_attribute(impl_->file.get(), name, H5T_NATIVE_INT64, H5T_STD_I64LE, {}, &value); });
}
void StatsFile::set_attribute(const std::string& name, double value) {
  impl_->on_root([&] { impl_->write_attribute(impl_->file.get(), name, H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE, {}, &value); });
}
void StatsFile::set_attribute(const std::string& name, const std::vector<std::string>& values) {
  impl_->on_root([&] { impl_->write_strings(impl_->file.get(), name, values, false); });
}
void StatsFile::set_attribute(const std::string& name, const std::vector<double>& values) {
  impl_->on_root([&] {
    impl_->write_attribute(impl_->file.get(), name, H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE, {values.size()}, values.data());
  });
}

void StatsFile::declare(const std::string& path, SeriesType type, int width, const std::string& units,
                        const std::string& description) {
  impl_->declare(path, type, false, width, rows_, units, description);
}
void StatsFile::declare_per_rank(const std::string& path, SeriesType type, const std::string& units,
                                 const std::string& description) {
  impl_->declare(path, type, true, impl_->size, rows_, units, description);
}

void StatsFile::set_dataset_attribute(const std::string& path, const std::string& name,
                                      const std::vector<double>& values) {
  impl_->set_dataset_attribute(path, [&](hid_t object) {
    impl_->write_attribute(object, name, H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE, {values.size()}, values.data());
  });
}
void StatsFile::set_dataset_attribute(const std::string& path, const std::string& name,
                                      const std::vector<std::string>& values) {
  impl_->set_dataset_attribute(path, [&](hid_t object) { impl_->write_strings(object, name, values, false); });
}
void StatsFile::set_dataset_attribute(const std::string& path, const std::string& name, const std::string& value) {
  impl_->set_dataset_attribute(path, [&](hid_t object) { impl_->write_strings(object, name, {value}, true); });
}

void StatsFile::append(const StatsRow& row) {
  const std::int64_t flushed = impl_->append(row);
  ++rows_;
  if (flushed >= 0) flushed_rows_ = flushed;
}

void StatsFile::write_array(const std::string& path, const std::vector<double>& data,
                            const std::vector<std::int64_t>& dims, const std::string& units,
                            const std::string& description) {
  impl_->write_array(path, H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE, data.data(), data.size(), dims, units, description);
}
void StatsFile::write_array(const std::string& path, const std::vector<std::int64_t>& data,
                            const std::vector<std::int64_t>& dims, const std::string& units,
                            const std::string& description) {
  impl_->write_array(path, H5T_NATIVE_INT64, H5T_STD_I64LE, data.data(), data.size(), dims, units, description);
}

std::optional<std::string> read_root_string_attribute(const std::string& path, const std::string& name) {
  struct stat info {};
  PULSE_CHECK(::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode),
              "statistics file '" + path + "' is missing or not a regular file");
  QuietHdf5 quiet;
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  PULSE_CHECK(file >= 0, "statistics file '" + path + "' cannot be opened as HDF5");
  std::optional<std::string> value;
  std::string problem;
  if (H5Aexists(file, name.c_str()) > 0) {
    const hid_t attribute = H5Aopen(file, name.c_str(), H5P_DEFAULT);
    const hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, H5T_VARIABLE);
    H5Tset_cset(type, H5T_CSET_UTF8);
    char* text = nullptr;
    if (attribute >= 0 && H5Aread(attribute, type, &text) >= 0 && text)
      value = text;
    else
      problem = "its attribute '" + name + "' is not a string";
    if (text) H5free_memory(text);
    H5Tclose(type);
    if (attribute >= 0) H5Aclose(attribute);
  }
  H5Fclose(file);
  PULSE_CHECK(problem.empty(), "statistics file '" + path + "': " + problem);
  return value;
}

}  // namespace pulse::io
