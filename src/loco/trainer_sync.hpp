#pragma once
// How trainers keep their weights in step: DDP (gradient allreduce every inner step), DiLoCo
// (dense FP32 pseudo-gradients every H steps) or PULSELoCo (gated sparse pseudo-gradients), and
// how PULSELoCo's trainers exchange their payloads. Plain C++: the settings (train_config) use it.
#include <string>

#include "core/enum_names.hpp"

namespace pulse::loco {

enum class TrainerSync { ddp, diloco, pulseloco };
inline constexpr NamedValue<TrainerSync> trainer_sync_names[] = {
    {TrainerSync::ddp, "ddp"}, {TrainerSync::diloco, "diloco"}, {TrainerSync::pulseloco, "pulseloco"}};

// allgather: every trainer's payload to every trainer (docs/loco.md). sparse_allreduce: a sparse
// reduce-scatter by owner chunk plus an allgather of the owners' sums; above dense_threshold
// mean density it switches to the dense exchange DiLoCo uses.
enum class SparseExchange { allgather, sparse_allreduce };
inline constexpr NamedValue<SparseExchange> sparse_exchange_names[] = {
    {SparseExchange::allgather, "allgather"}, {SparseExchange::sparse_allreduce, "sparse-allreduce"}};

inline const char* trainer_sync_name(TrainerSync mode) { return name_of(trainer_sync_names, mode); }
TrainerSync parse_trainer_sync(const std::string& name);  // throws pulse::Error listing the choices
inline const char* sparse_exchange_name(SparseExchange exchange) { return name_of(sparse_exchange_names, exchange); }
SparseExchange parse_sparse_exchange(const std::string& name);  // throws pulse::Error listing the choices

}  // namespace pulse::loco
