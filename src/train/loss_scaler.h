// Dynamic loss scaling for fp16 training, with the rules and defaults of PyTorch's torch.cuda.amp.GradScaler.
#pragma once

#include <cstdint>

namespace vit {

// fp16 has 5 exponent bits: gradients below ~6e-8 flush to zero. The loss is multiplied by `scale()` before backward
// so that they stay representable, and the gradients are divided by it again before clipping and the update. When a
// step's gradients overflow (a non-finite norm) the update is skipped and the scale halves; after every
// kGrowthInterval good steps it doubles, probing for the largest scale that does not overflow. The constants are
// GradScaler's defaults (init_scale 2^16, growth_factor 2, backoff_factor 0.5, growth_interval 2000). Disabled
// (bf16, float32), the scale is 1 and nothing changes.
class LossScaler {
 public:
  static constexpr double kInitialScale = 65536.0;
  static constexpr int64_t kGrowthInterval = 2000;

  explicit LossScaler(bool enabled) : enabled_(enabled) {}

  bool enabled() const { return enabled_; }
  // What the loss is multiplied by before backward (1 when disabled).
  double scale() const { return enabled_ ? scale_ : 1.0; }

  // After a step: `finite` = the unscaled gradients were finite. Returns whether the update may be applied; false
  // means an fp16 overflow (the scale was halved). Disabled, every step may be applied.
  bool update(bool finite) {
    if (!enabled_) return true;
    if (!finite) {
      scale_ /= 2.0;
      good_steps_ = 0;
      return false;
    }
    if (++good_steps_ % kGrowthInterval == 0) scale_ *= 2.0;
    return true;
  }

  // For the resume state: the scale and the good steps since it last changed (saved even when disabled).
  double raw_scale() const { return scale_; }
  int64_t good_steps() const { return good_steps_; }
  void restore(double scale, int64_t good_steps) { scale_ = scale, good_steps_ = good_steps; }

 private:
  bool enabled_;
  double scale_ = kInitialScale;
  int64_t good_steps_ = 0;
};

}  // namespace vit
