#include "cli/folder_filter.hpp"

#include <fnmatch.h>

#include <algorithm>

namespace pulse::cli {

namespace {

// A glob matches a path, or (globs without '/') its file name in any subfolder.
bool matches(const std::string& glob, const std::string& relative) {
  if (::fnmatch(glob.c_str(), relative.c_str(), FNM_PATHNAME) == 0) return true;
  if (glob.find('/') != std::string::npos) return false;
  const std::size_t slash = relative.rfind('/');
  return slash != std::string::npos && ::fnmatch(glob.c_str(), relative.c_str() + slash + 1, 0) == 0;
}

bool any_matches(const std::vector<std::string>& globs, const std::string& relative) {
  return std::any_of(globs.begin(), globs.end(), [&](const std::string& g) { return matches(g, relative); });
}

}  // namespace

const std::vector<std::string>& FolderFilter::trainer_files() {
  static const std::vector<std::string> globs = {"optimizer.pt", "optimizer.bin", "scheduler.pt", "scaler.pt",
                                                 "rng_state*.pth", "trainer_state.json", "training_args.bin"};
  return globs;
}

bool FolderFilter::is_trainer_file(const std::string& relative) { return any_matches(trainer_files(), relative); }

bool FolderFilter::keeps(const std::string& relative) const {
  const bool included = any_matches(include_, relative);
  if (!include_.empty() && !included) return false;
  if (any_matches(exclude_, relative)) return false;
  return included || !is_trainer_file(relative);
}

std::string FolderFilter::left_out_line(const std::vector<std::string>& relatives) const {
  std::vector<std::string> trainer, excluded;
  for (const std::string& r : relatives)
    if (!keeps(r)) (is_trainer_file(r) && !any_matches(exclude_, r) && include_.empty() ? trainer : excluded).push_back(r);
  if (trainer.empty() && excluded.empty()) return "";
  auto list = [](const std::vector<std::string>& names) {
    std::string out;
    for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
    return out;
  };
  std::string line = "left out ";
  if (!trainer.empty()) line += list(trainer) + " (Hugging Face Trainer files; --include NAME keeps one)";
  if (!excluded.empty()) line += (trainer.empty() ? "" : "; ") + list(excluded) + " (by --include/--exclude)";
  return line;
}

}  // namespace pulse::cli
