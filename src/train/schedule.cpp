// Learning rate schedule: linear warmup, then half a cosine down to the floor.
#include "train/schedule.h"

#include <algorithm>
#include <cmath>

namespace vit {

double Schedule::lr_at(int64_t step) const {
  if (step < warmup_steps) {
    return warmup_lr + (lr - warmup_lr) * static_cast<double>(step) / static_cast<double>(warmup_steps);
  }
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup_steps);
  const double t = std::min(1.0, static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps));
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * t));
}

Schedule make_schedule(const TrainConfig& train, int64_t steps_per_epoch) {
  Schedule s;
  s.lr = train.lr;
  s.min_lr = train.min_lr;
  s.warmup_lr = train.warmup_lr;
  s.total_steps = std::max<int64_t>(1, train.epochs * steps_per_epoch);
  if (train.max_steps > 0) s.total_steps = std::min(s.total_steps, train.max_steps);
  s.warmup_steps = train.warmup_steps > 0
                       ? train.warmup_steps
                       : static_cast<int64_t>(std::llround(train.warmup_epochs * static_cast<double>(steps_per_epoch)));
  s.warmup_steps = std::min(s.warmup_steps, s.total_steps);
  return s;
}

}  // namespace vit
