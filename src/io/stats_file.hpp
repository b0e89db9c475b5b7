#pragma once
// The per-run HDF5 statistics file (docs/statistics.md).
//
// Layout, for readers:
// - root attribute "pulse_stats_format" (int64, currently 1) marks a pulse stats file;
// - root attribute "datasets": a JSON object, every dataset path -> {"kind", "units", "description"},
//   kind one of "per_step" (steps,) or (steps, w), "per_rank" (steps, nranks), "array" (fixed shape);
// - every dataset also carries its own "units" and "description" attributes;
// - series grow by one row per append(); their first dimension is the true row count, and unset
//   entries read as NaN (float64) or -1 (int64).
// The app chooses the dataset paths ("/steps/loss", "/ranks/bytes_sent", ...); groups are created
// as needed.
//
// Survives a kill of any rank at any moment: rank 0 alone holds the file, in memory (HDF5's core
// driver), and gathers the other ranks' per-rank columns with each row. A flush writes the whole
// file image to a temporary file next to the path, fsyncs it and renames it over the path, so the
// path always holds a complete file as of some flush, which plain h5py opens. Rows are buffered
// and flushed every `flush_rows` rows or `flush_seconds` seconds (whichever comes first, checked
// at each append), at flush() and at destruction; a kill loses the rows since the last flush.
// (HDF5's SWMR mode was not used: after a crash it leaves a superblock mark that stops non-SWMR
// readers until `h5clear -s`, and it cannot create datasets or attributes, which write_array needs.)
#include <mpi.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace pulse::io {

enum class StatsOpen { create, overwrite, resume };
enum class SeriesType { float64, int64 };

// One step's values, keyed by series path. Only rank 0's values of per-step series are written;
// every rank's set_rank values land in its own column of a per-rank series.
class StatsRow {
 public:
  void set(const std::string& path, double value);
  void set(const std::string& path, const std::vector<double>& values);  // width-w series
  void set_int(const std::string& path, std::int64_t value);
  void set_int(const std::string& path, const std::vector<std::int64_t>& values);
  void set_rank(const std::string& path, double value);  // this rank's entry of a per-rank series
  void set_rank_int(const std::string& path, std::int64_t value);
  void clear() { values_.clear(); }

  struct Value {
    SeriesType type;
    bool per_rank;
    bool scalar;  // set(path, x) rather than set(path, {x...})
    std::vector<double> f64;
    std::vector<std::int64_t> i64;
  };
  const std::map<std::string, Value>& values() const { return values_; }

 private:
  std::map<std::string, Value> values_;
};

// A root string attribute of the stats file at path, read only (the file is not changed), or
// nullopt when it has none: for checks before a resume. Not collective. Throws pulse::Error
// naming the path when it is not a readable HDF5 file or the attribute is not a string.
std::optional<std::string> read_root_string_attribute(const std::string& path, const std::string& name);

class StatsFile {
 public:
  // Collective over comm: every rank calls every method in the same order with the same arguments
  // (data excepted). create: one-line pulse::Error if path exists, nothing touched; overwrite:
  // replaces it; resume: reads the existing file, checks it is a pulse stats file and drops rows
  // >= keep_rows on every series it lists, so the run continues from there (the path changes at
  // the next flush). Errors name the path and are thrown on all ranks alike. Temporary files of
  // an earlier writer killed inside a flush (PATH.tmp.*) are removed.
  StatsFile(MPI_Comm comm, const std::string& path, StatsOpen mode, std::int64_t keep_rows = 0);
  ~StatsFile();
  StatsFile(const StatsFile&) = delete;
  StatsFile& operator=(const StatsFile&) = delete;

  // Root attributes; setting one again replaces it.
  void set_attribute(const std::string& name, const std::string& value);
  void set_attribute(const std::string& name, std::int64_t value);
  void set_attribute(const std::string& name, double value);
  void set_attribute(const std::string& name, const std::vector<std::string>& values);
  void set_attribute(const std::string& name, const std::vector<double>& values);

  // Per-step series (rank 0's values): width 0 -> shape (steps,), width w -> (steps, w). On resume
  // an existing dataset is reopened and must match kind, type and width.
  void declare(const std::string& path, SeriesType type, int width, const std::string& units,
               const std::string& description);
  // Per-rank series: shape (steps, nranks); each rank writes its own column, collectively.
  void declare_per_rank(const std::string& path, SeriesType type, const std::string& units,
                        const std::string& description);

  // Attributes on a dataset already declared or written; setting one again replaces it.
  void set_dataset_attribute(const std::string& path, const std::string& name, const std::vector<double>& values);
  void set_dataset_attribute(const std::string& path, const std::string& name,
                             const std::vector<std::string>& values);
  void set_dataset_attribute(const std::string& path, const std::string& name, const std::string& value);

  // Appends one row to every declared series (buffered; flushed when due, see above). Throws on
  // every rank if any rank's row names an undeclared series or has the wrong kind, type or width
  // (nothing is written then), or if a due flush fails.
  void append(const StatsRow& row);
  std::int64_t rows() const { return rows_; }

  // Writes every row, array and attribute so far to the path (atomically, see above); a kill
  // afterwards loses nothing before this point. pulse-train calls it before each checkpoint, so
  // the file always holds the rows a resume keeps.
  void flush();
  // Rows the file at the path holds (as of the last flush).
  std::int64_t flushed_rows() const { return flushed_rows_; }
  // The flush policy: every `rows` appended rows (>= 1) or once `seconds` (> 0) have passed
  // since the last flush. Defaults: default_flush_rows, default_flush_seconds.
  void set_flush_interval(std::int64_t rows, double seconds);
  static constexpr std::int64_t default_flush_rows = 100;
  static constexpr double default_flush_seconds = 10.0;

  // A fixed array written once with rank 0's data (other ranks may pass empty data), e.g.
  // "/absorption/step_000010/ratio_counts"; writing an existing path replaces it (a resumed run
  // recomputes what it wrote before).
  void write_array(const std::string& path, const std::vector<double>& data, const std::vector<std::int64_t>& dims,
                   const std::string& units, const std::string& description);
  void write_array(const std::string& path, const std::vector<std::int64_t>& data,
                   const std::vector<std::int64_t>& dims, const std::string& units, const std::string& description);

  const std::string& path() const { return path_; }

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  std::string path_;
  std::int64_t rows_ = 0;
  std::int64_t flushed_rows_ = 0;
};

}  // namespace pulse::io
