#pragma once
// Outputs that would destroy an input: an output path that names an input (through a link or
// another spelling), lies inside an input folder, or is a folder that holds an input.
#include <string>
#include <vector>

namespace pulse::cli {

// True when a and b name the same existing file or folder (st_dev and st_ino).
bool same_file(const std::string& a, const std::string& b);

// Throws pulse::Error naming `option` and the input when writing `out` would overwrite or
// delete one of `inputs` (missing inputs are skipped).
void refuse_output_over_inputs(const std::string& out, const std::string& option, const std::vector<std::string>& inputs);

}  // namespace pulse::cli
