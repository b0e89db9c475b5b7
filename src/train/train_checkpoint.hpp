#pragma once
// Training checkpoints: everything a rank needs to continue bit for bit (weights, Adam moments,
// lagged weight versions, a reused rollout batch, outer-loop buffers) in one checksummed file per
// rank (rank_checkpoint.hpp), plus a LATEST record naming the step. Each rank writes
//   DIR/rank-<r>-step-<s>.safetensors   (atomically)
// then, after all ranks have written, rank 0 writes DIR/LATEST (atomically) and removes older
// steps. A crash at any point leaves LATEST naming a complete earlier checkpoint.
#include <cstdint>
#include <optional>
#include <string>

#include "comm/communicator.hpp"
#include "train/rank_checkpoint.hpp"

namespace pulse {

// Collective over world: every rank passes its own state. Returns after LATEST names step.
void save_checkpoint_collective(const Communicator& world, const std::string& dir, std::int64_t step,
                                const RankCheckpoint& state);
// The step LATEST names, if dir holds a checkpoint.
std::optional<std::int64_t> latest_checkpoint_step(const std::string& dir);
RankCheckpoint load_rank_checkpoint(const std::string& dir, int rank, std::int64_t step);

}  // namespace pulse
