#include "loco/trainer_sync.hpp"

#include "core/error.hpp"

namespace pulse::loco {

TrainerSync parse_trainer_sync(const std::string& name) {
  if (const auto mode = value_named(trainer_sync_names, name)) return *mode;
  throw_error(__FILE__, __LINE__, "unknown trainer sync '" + name + "' (" + names_text(trainer_sync_names) + ")");
}

SparseExchange parse_sparse_exchange(const std::string& name) {
  if (const auto exchange = value_named(sparse_exchange_names, name)) return *exchange;
  throw_error(__FILE__, __LINE__,
              "unknown sparse exchange '" + name + "' (" + names_text(sparse_exchange_names) + ")");
}

}  // namespace pulse::loco
