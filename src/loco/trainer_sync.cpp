#include "loco/trainer_sync.hpp"

#include "core/error.hpp"

namespace pulse::loco {

const char* trainer_sync_name(TrainerSync mode) {
  switch (mode) {
    case TrainerSync::ddp: return "ddp";
    case TrainerSync::diloco: return "diloco";
    case TrainerSync::pulseloco: return "pulseloco";
  }
  throw_error(__FILE__, __LINE__, "invalid TrainerSync " + std::to_string(static_cast<int>(mode)));
}

TrainerSync parse_trainer_sync(const std::string& name) {
  for (TrainerSync mode : {TrainerSync::ddp, TrainerSync::diloco, TrainerSync::pulseloco})
    if (name == trainer_sync_name(mode)) return mode;
  throw_error(__FILE__, __LINE__, "unknown trainer sync '" + name + "' (ddp, diloco, pulseloco)");
}

}  // namespace pulse::loco
