// AdamW's update over one contiguous run of a flat parameter buffer (train/optimizer.cpp's FlatAdamW), element by
// element in torch.optim.AdamW's (non-foreach) arithmetic order. A unit of its own, without LibTorch, compiled with
// -fno-math-errno, without which GCC keeps the sqrt scalar behind errno's check (the update was 3.3% of the
// Fashion-MNIST default's training step), and -ffp-contract=off: no fused multiply-adds, so the roundings stay torch's.
#pragma once

#include <cstdint>

namespace vit {

struct AdamWScalars {
  float beta1, beta2, eps;
  float denom_scale;  // sqrt(1 - beta2^step)
  float step;         // lr / (1 - beta1^step)
  float decay;        // 1 - lr weight_decay; applied only with decayed
};

// p -= step m / (sqrt(v) / denom_scale + eps) after m, v take the gradient g, and p first decays where decayed; n
// elements of each array, which must not overlap.
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s, bool decayed);

}  // namespace vit
