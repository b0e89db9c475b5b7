#pragma once
// How trainers keep their weights in step: DDP (gradient allreduce every inner step), DiLoCo
// (dense FP32 pseudo-gradients every H steps) or PULSELoCo (gated sparse pseudo-gradients).
#include <string>

namespace pulse::loco {

enum class TrainerSync { ddp, diloco, pulseloco };

const char* trainer_sync_name(TrainerSync mode);                // "ddp", "diloco", "pulseloco"
TrainerSync parse_trainer_sync(const std::string& name);  // throws pulse::Error listing the choices

}  // namespace pulse::loco
