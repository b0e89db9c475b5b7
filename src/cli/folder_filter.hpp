#pragma once
// Which files of a checkpoint folder a tool reads: --include/--exclude globs (fnmatch, '*' not
// crossing '/') on the paths relative to the folder, and by default not the files Hugging Face's
// Trainer writes beside the model (optimizer and scheduler state, RNG states, trainer state,
// training arguments: megabytes that are no part of the weights), unless an --include names one.
#include <string>
#include <vector>

namespace pulse::cli {

class FolderFilter {
 public:
  FolderFilter() = default;
  FolderFilter(std::vector<std::string> include, std::vector<std::string> exclude)
      : include_(std::move(include)), exclude_(std::move(exclude)) {}

  // Whether the file at this folder-relative path is read.
  bool keeps(const std::string& relative) const;

  // Whether the path is one of the Trainer's files (by the globs of trainer_files()).
  static bool is_trainer_file(const std::string& relative);
  static const std::vector<std::string>& trainer_files();

  // One line naming the files left out (none: empty), e.g. "left out optimizer.pt, rng_state.pth
  // (Hugging Face Trainer files; --include NAME keeps one)".
  std::string left_out_line(const std::vector<std::string>& relatives) const;

 private:
  std::vector<std::string> include_, exclude_;
};

}  // namespace pulse::cli
