// See train/adamw_update.h.
#include "train/adamw_update.h"

#include <cmath>

namespace vit {

void adamw_update(float* p_in, const float* g_in, float* m_in, float* v_in, int64_t n, const AdamWScalars& s,
                  bool decayed) {
  float* __restrict p = p_in;
  const float* __restrict g = g_in;
  float* __restrict m = m_in;
  float* __restrict v = v_in;
  const float b1 = s.beta1, b2 = s.beta2, eps = s.eps, denom_scale = s.denom_scale, step = s.step;
  const float decay = decayed ? s.decay : 1.0f;  // p times 1 is p, exactly
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    p[i] *= decay;
    const float mi = m[i] * b1 + (1.0f - b1) * gi;
    const float vi = v[i] * b2 + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] -= step * (mi / (std::sqrt(vi) / denom_scale + eps));
  }
}

}  // namespace vit
