// Learning rate per optimiser step: linear warmup from warmup_lr, then cosine decay to min_lr.
#pragma once

#include <cstdint>

#include "config/config.h"

namespace vit {

struct Schedule {
  double lr = 1e-3;         // peak, reached at the end of warmup
  double min_lr = 0.0;      // reached at total_steps
  double warmup_lr = 0.0;   // value at step 0
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;

  double lr_at(int64_t step) const;
};

// Warmup length from warmup_steps, else warmup_epochs * steps_per_epoch; total = epochs * steps_per_epoch
// (or max_steps when that is smaller).
Schedule make_schedule(const TrainConfig& train, int64_t steps_per_epoch);

}  // namespace vit
