// The kernels of model/row_kernels.h, included once per instruction set by row_kernels*.cpp with
// VIT_ROW_KERNELS_ISA naming the namespace (and the unit's -m flags choosing the instructions). Everything here is
// in that namespace, so the three copies never meet.
#ifndef VIT_ROW_KERNELS_ISA
#error "define VIT_ROW_KERNELS_ISA before including row_kernels_impl.h"
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "model/row_kernels.h"

#ifndef VIT_VECTOR_FLOATS
#error "define VIT_VECTOR_FLOATS (the unit's native vector width in floats) before including row_kernels_impl.h"
#endif

#define VIT_INLINE inline __attribute__((always_inline))

namespace vit::VIT_ROW_KERNELS_ISA {
namespace {
// Cephes' expf after its range reduction: e^x = e^r 2^n with r = x - n ln 2, |r| <= ln 2 / 2, e^r by a degree-5
// polynomial; for a float or a whole vector of them.
template <typename T>
VIT_INLINE T exp_of_remainder(T x, T n) {
  T r = x - n * 0.693359375f;
  r -= n * -2.12194440e-4f;
  T p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r * r + r + 1.0f;
}

// e^x for x <= 0 (a softmax's x - max), within 2 ulp, branch-free. Below -87.3, e^x is denormal: the softmax sums
// it as the zero it nearly is.
VIT_INLINE float exp_nonpositive(float x) {
  x = std::max(x, -87.3f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n
  return exp_of_remainder(x, n) * __builtin_bit_cast(float, bits);
}

// The unit's native vector: 16 floats with AVX-512, 8 with AVX2, 4 at the SSE2 baseline (row_kernels*.cpp say).
constexpr int W = VIT_VECTOR_FLOATS;
typedef float vec __attribute__((vector_size(4 * W), aligned(4)));  // unaligned loads and stores
typedef int32_t ivec __attribute__((vector_size(4 * W)));

VIT_INLINE vec loadv(const float* p) { return *reinterpret_cast<const vec*>(p); }
VIT_INLINE void storev(float* p, vec x) { *reinterpret_cast<vec*>(p) = x; }

// One float from a vector's W lanes by op, folded in halves: log2 W dependent steps where a loop over the lanes is a
// chain of W - 1 (4 cycles each; in the short attention's softmax that chain was its largest cost).
template <typename Op>
VIT_INLINE float fold_lanes(vec x, const Op& op) {
#if VIT_VECTOR_FLOATS == 16
  x = op(x, __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
  x = op(x, __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));
  x = op(x, __builtin_shufflevector(x, x, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));
  x = op(x, __builtin_shufflevector(x, x, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14));
#elif VIT_VECTOR_FLOATS == 8
  x = op(x, __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3));
  x = op(x, __builtin_shufflevector(x, x, 2, 3, 0, 1, 6, 7, 4, 5));
  x = op(x, __builtin_shufflevector(x, x, 1, 0, 3, 2, 5, 4, 7, 6));
#elif VIT_VECTOR_FLOATS == 4
  x = op(x, __builtin_shufflevector(x, x, 2, 3, 0, 1));
  x = op(x, __builtin_shufflevector(x, x, 1, 0, 3, 2));
#else
#error "fold_lanes: 4, 8 or 16 lanes"
#endif
  return x[0];
}
VIT_INLINE float max_lanes(vec x) {
  return fold_lanes(x, [](vec a, vec b) { return a > b ? a : b; });
}
VIT_INLINE float sum_lanes(vec x) {
  return fold_lanes(x, [](vec a, vec b) { return a + b; });
}

// The largest of n >= 1 floats (of their magnitudes with Abs), on whole vectors. GCC 12 leaves a float max reduction
// scalar, even under `omp simd reduction(max)`: a chain of 4-cycle maxss, which was 60% of softmax_rows' time over
// ViT-Ti's 197 keys. A NaN may hide the other values of its vector lane; a softmax row with one is NaN either way.
template <bool Abs = false, bool Negated = false>
VIT_INLINE float max_of(const float* x, int64_t n) {
  const auto value = [](vec v) {
    if (Abs) return __builtin_bit_cast(vec, __builtin_bit_cast(ivec, v) & 0x7fffffff);
    return Negated ? -v : v;
  };
  const auto scalar = [](float v) { return Abs ? std::fabs(v) : Negated ? -v : v; };
  float max = scalar(x[0]);
  int64_t j = 1;
  if (n >= W) {
    vec top = value(loadv(x));
    for (j = W; j + W <= n; j += W) {
      const vec v = value(loadv(x + j));
      top = v > top ? v : top;
    }
    max = std::max(max, max_lanes(top));
  }
  for (; j < n; ++j) max = std::max(max, scalar(x[j]));
  return max;
}
// The largest of -x over n >= 1 floats: minus their smallest.
VIT_INLINE float max_of_negated(const float* x, int64_t n) { return max_of<false, true>(x, n); }

// exp_nonpositive on a whole vector (the compiler does not vectorize a loop over an array written as vectors).
VIT_INLINE vec exp_nonpositive(vec x) {
  x = x < -87.3f ? vec{} - 87.3f : x;
  const vec y = x * 1.44269504088896341f + 0.5f;
  vec n = __builtin_convertvector(__builtin_convertvector(y, ivec), vec);  // truncation toward zero
  n = n > y ? n - 1.0f : n;                                                // floor
  const ivec bits = (__builtin_convertvector(n, ivec) + 127) << 23;         // 2^n
  return exp_of_remainder(x, n) * __builtin_bit_cast(vec, bits);
}

// out = (x - mean) rstd w + b over one row of D; mean and rstd are kept where asked (training).
void layer_norm_row(const float* x, int64_t D, float eps, const float* w, const float* b, float* out, float* mean_out,
                    float* rstd_out) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < D; ++j) sum += x[j];
  const float mean = sum / static_cast<float>(D);
  float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
  for (int64_t j = 0; j < D; ++j) squares += (x[j] - mean) * (x[j] - mean);
  const float rstd = 1.0f / std::sqrt(squares / static_cast<float>(D) + eps);
#pragma omp simd
  for (int64_t j = 0; j < D; ++j) out[j] = (x[j] - mean) * rstd * w[j] + b[j];
  if (mean_out != nullptr) *mean_out = mean, *rstd_out = rstd;
}

// out = base + branch gamma keep (gamma null without LayerScale): a residual add behind LayerScale and drop path.
void add_branch_row(const float* base, const float* branch, const float* gamma, float keep, int64_t D, float* out) {
  if (gamma != nullptr) {
#pragma omp simd
    for (int64_t j = 0; j < D; ++j) out[j] = base[j] + branch[j] * gamma[j] * keep;
  } else {
#pragma omp simd
    for (int64_t j = 0; j < D; ++j) out[j] = base[j] + branch[j] * keep;
  }
}

// The backward of add_branch_row towards the branch: dbranch = dout gamma keep; dgamma += dout keep branch;
// dbias += dbranch (the branch's last bias).
void branch_backward_row(const float* dout, const float* branch, const float* gamma, float keep, int64_t D,
                         float* dbranch, float* dgamma, float* dbias) {
#pragma omp simd
  for (int64_t j = 0; j < D; ++j) {
    dbranch[j] = gamma != nullptr ? dout[j] * gamma[j] * keep : dout[j] * keep;
    dbias[j] += dbranch[j];
  }
  if (dgamma != nullptr) {
#pragma omp simd
    for (int64_t j = 0; j < D; ++j) dgamma[j] += dout[j] * keep * branch[j];
  }
}

// Layer norm's backward over one row: dx = base + rstd (g - mean(g) - xhat mean(g xhat)) with g = dout w and
// xhat = (x - mean) rstd; dw += dout xhat, db += dout.
void layer_norm_backward_row(const float* dout, const float* x, float mean, float rstd, const float* w, int64_t D,
                             const float* base, float* dx, float* dw, float* db) {
  float sum_g = 0.0f, sum_g_xhat = 0.0f;
#pragma omp simd reduction(+ : sum_g, sum_g_xhat)
  for (int64_t j = 0; j < D; ++j) {
    const float xhat = (x[j] - mean) * rstd;
    const float g = dout[j] * w[j];
    sum_g += g;
    sum_g_xhat += g * xhat;
    dw[j] += dout[j] * xhat;
    db[j] += dout[j];
  }
  const float mean_g = sum_g / static_cast<float>(D), mean_g_xhat = sum_g_xhat / static_cast<float>(D);
#pragma omp simd
  for (int64_t j = 0; j < D; ++j) {
    const float xhat = (x[j] - mean) * rstd;
    dx[j] = base[j] + rstd * (dout[j] * w[j] - mean_g - xhat * mean_g_xhat);
  }
}

// RmsNorm over one row: out = x rstd w with rstd = 1 / sqrt(mean(x^2) + eps), kept where asked (training).
void rms_norm_row(const float* x, int64_t D, float eps, const float* w, float* out, float* rstd_out) {
  float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
  for (int64_t j = 0; j < D; ++j) squares += x[j] * x[j];
  const float rstd = 1.0f / std::sqrt(squares / static_cast<float>(D) + eps);
#pragma omp simd
  for (int64_t j = 0; j < D; ++j) out[j] = x[j] * rstd * w[j];
  if (rstd_out != nullptr) *rstd_out = rstd;
}

// RmsNorm's backward over one row: dx = base + rstd (g - xhat mean(g xhat)) with g = dout w and xhat = x rstd;
// dw += dout xhat.
void rms_norm_backward_row(const float* dout, const float* x, float rstd, const float* w, int64_t D, const float* base,
                           float* dx, float* dw) {
  float sum_g_xhat = 0.0f;
#pragma omp simd reduction(+ : sum_g_xhat)
  for (int64_t j = 0; j < D; ++j) {
    const float xhat = x[j] * rstd;
    sum_g_xhat += dout[j] * w[j] * xhat;
    dw[j] += dout[j] * xhat;
  }
  const float mean_g_xhat = sum_g_xhat / static_cast<float>(D);
#pragma omp simd
  for (int64_t j = 0; j < D; ++j) dx[j] = base[j] + rstd * (dout[j] * w[j] - x[j] * rstd * mean_g_xhat);
}

void add_row(const float* src, int64_t n, float* acc) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) acc[j] += src[j];
}

// bfloat16 of n floats, to nearest even: the upper 16 bits after adding 0x7fff plus the lowest bit kept; NaN as
// 0x7fc0 (c10::BFloat16's rounding). A select, not a branch, so that it vectorizes.
void round_bf16_row(const float* x_in, int64_t n, uint16_t* out_in) {
  const float* __restrict x = x_in;
  uint16_t* __restrict out = out_in;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    uint32_t u;
    std::memcpy(&u, x + j, sizeof u);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    out[j] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : rounded);
  }
}

// Softmax over each of rows rows of cols, in place; the exp on whole vectors (W at a time), the tail one by one.
void softmax_rows(float* s, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i) {
    float* row = s + i * cols;
    const float max = max_of(row, cols);
    vec sums = {};
    int64_t j = 0;
    for (; j + W <= cols; j += W) {
      const vec e = exp_nonpositive(loadv(row + j) - max);
      storev(row + j, e);
      sums += e;
    }
    float sum = 0.0f;
    for (; j < cols; ++j) sum += row[j] = exp_nonpositive(row[j] - max);
    const float inverse = 1.0f / (sum + sum_lanes(sums));
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) row[c] *= inverse;
  }
}

// Softmax's backward in place: ds = p (dp - sum_j dp p) per row, over dp.
void softmax_backward_rows(const float* p, float* dp, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* p_row = p + i * cols;
    float* d_row = dp + i * cols;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j < cols; ++j) dot += d_row[j] * p_row[j];
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) d_row[j] = p_row[j] * (d_row[j] - dot);
  }
}

// ---- GELU with its derivative (training) ----

// Phi(x) and x phi(x) (the standard normal's CDF and density, times x) from one exp: Phi(x) = (1 + erf(x / sqrt 2)) / 2
// with erf(z) = 1 - t P(t) e^-z^2, t = 1 / (1 + p |z|) (Abramowitz and Stegun 7.1.26, absolute error 1.5e-7, the form
// oneDNN's gelu_erf uses). Below zero Phi is the half tail t P(t) e^-z^2 / 2 itself, not 1 minus its complement, so it
// does not round to zero far out as 1 + erf does (within 3.1% of it down to -12). And e^-z^2 = e^(-x^2 / 2) is
// sqrt(2 pi) phi(x).
VIT_INLINE void normal_cdf_and_density(vec x, vec& cdf, vec& x_density) {
  const vec z2 = x * x * -0.5f;  // -z^2 with z = x / sqrt 2
  const vec e = exp_nonpositive(z2);
  const vec abs_z = __builtin_bit_cast(vec, __builtin_bit_cast(ivec, x) & 0x7fffffff) * 0.70710678118654752f;
  const vec t = 1.0f / (abs_z * 0.3275911f + 1.0f);
  vec poly = t * 1.061405429f - 1.453152027f;
  poly = poly * t + 1.421413741f;
  poly = poly * t - 0.284496736f;
  poly = poly * t + 0.254829592f;
  const vec half_tail = poly * t * e * 0.5f;
  cdf = x < 0.0f ? half_tail : 1.0f - half_tail;
  x_density = x * e * 0.39894228040143268f;  // 1 / sqrt(2 pi)
}

void gelu_with_derivative(float* x, float* g, int64_t n) {
  int64_t j = 0;
  for (; j + W <= n; j += W) {
    const vec v = loadv(x + j);
    vec cdf, x_density;
    normal_cdf_and_density(v, cdf, x_density);
    storev(g + j, v * cdf);
    storev(x + j, cdf + x_density);
  }
  if (j < n) {  // the tail, through a zero-padded vector
    vec v = {};
    for (int64_t l = 0; l < n - j; ++l) v[l] = x[j + l];
    vec cdf, x_density;
    normal_cdf_and_density(v, cdf, x_density);
    const vec out = v * cdf, derivative = cdf + x_density;
    for (int64_t l = 0; l < n - j; ++l) g[j + l] = out[l], x[j + l] = derivative[l];
  }
}

// ---- attention of one (image, head) for short sequences ----
// Below 64 tokens an sgemm call costs more than its product (the Fashion-MNIST default: 17 tokens, 512 (image, head)
// pairs per block, four products each in the backward). These kernels keep a query row's scores and the accumulators of
// its output in registers instead: keys padded to KB blocks of 16, the head dimension HB blocks of 16, both fixed at
// compile time. q, k, v are (N, hd) row blocks with row stride `row` (3D: read in place from qkv).

// Swaps the off-diagonal s x s blocks of the 2 x 2 block matrix whose rows are a and b, lane by lane: lanes with bit s
// of a take b's lanes s lower, b's lanes without bit s take a's s higher. Over s = W/2 .. 1 this transposes W rows.
template <int s, int... L>
VIT_INLINE void swap_blocks(vec& a, vec& b, std::integer_sequence<int, L...>) {
  const vec a2 = __builtin_shufflevector(a, b, ((L & s) != 0 ? W + L - s : L)...);
  const vec b2 = __builtin_shufflevector(a, b, ((L & s) != 0 ? W + L : L + s)...);
  a = a2, b = b2;
}

// rows[0..W) transposed in registers: log2 W stages of W two-source shuffles, where a scalar transpose moves each of
// the W x W floats on its own (it was a quarter of the short attention's forward). Lanes: W (a template parameter only
// so that the stages this unit's width lacks are not instantiated).
template <int Lanes = W>
VIT_INLINE void transpose_tile(vec* rows) {
  constexpr auto lanes = std::make_integer_sequence<int, Lanes>{};
  auto stage = [&](auto block) {
    constexpr int s = decltype(block)::value;
#pragma GCC unroll 16
    for (int i = 0; i < Lanes; ++i) {
      if ((i & s) == 0) swap_blocks<s>(rows[i], rows[i + s], lanes);
    }
  };
  if constexpr (Lanes >= 16) stage(std::integral_constant<int, 8>{});
  if constexpr (Lanes >= 8) stage(std::integral_constant<int, 4>{});
  stage(std::integral_constant<int, 2>{});
  stage(std::integral_constant<int, 1>{});
}

// dst (hd, 16 KB) = src (N, hd; row stride row) transposed, zero past N, tile by tile of W x W.
template <int KB>
VIT_INLINE void transpose_padded(const float* src, int64_t row, int64_t N, int64_t hd, float* dst) {
  constexpr int keys = 16 * KB;
  for (int64_t j0 = 0; j0 < keys; j0 += W) {
    for (int64_t d0 = 0; d0 < hd; d0 += W) {
      // Aligned to its size: clang drops vec's aligned(4) in the templates below (their vec& is the canonical,
      // naturally aligned vector type), so it may move the tile with aligned loads and stores.
      alignas(sizeof(vec)) vec tile[W];
#pragma GCC unroll 16
      for (int j = 0; j < W; ++j) tile[j] = j0 + j < N ? loadv(src + (j0 + j) * row + d0) : vec{};
      transpose_tile(tile);
#pragma GCC unroll 16
      for (int d = 0; d < W; ++d) storev(dst + (d0 + d) * keys + j0, tile[d]);
    }
  }
}

// Output row r (16 B floats at out + r out_row) = sum over n < count of weights[r weight_row + n weight_stride]
// rows[n row_stride], for the R rows at once: each row's sum is a chain of dependent multiply-adds, so R rows side
// by side keep R times as many in flight (and load each of `rows` once for all R). Each weight goes straight from
// memory into its multiply-add as a broadcast operand (AVX-512's {1to16}): one instruction a multiply-add, no
// shuffle. The shape of (scale q) k^T, p v, P^T dO, dO v^T, dS k and dS^T q.
template <int B, int R>
VIT_INLINE void weighted_rows(const float* weights, int64_t weight_stride, int64_t weight_row, const float* rows,
                              int64_t row_stride, int64_t count, float* out, int64_t out_row) {
  constexpr int V = B * 16 / W;
  vec acc[R][V];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int b = 0; b < V; ++b) acc[r][b] = vec{};
  }
  for (int64_t n = 0; n < count; ++n) {
    vec x[V];
#pragma GCC unroll 4
    for (int b = 0; b < V; ++b) x[b] = loadv(rows + n * row_stride + W * b);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float weight = weights[r * weight_row + n * weight_stride];
#pragma GCC unroll 4
      for (int b = 0; b < V; ++b) acc[r][b] += weight * x[b];
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int b = 0; b < V; ++b) storev(out + r * out_row + W * b, acc[r][b]);
  }
}

// weighted_rows for `out_rows` output rows, R at a time, then what remains in halves. R: as many rows as half the
// unit's vector registers hold as accumulators, at most 8. Two FMA ports of 4 cycles' latency need 8 independent chains
// to stay busy; with 4 (the earlier cap) and the weights scaled and shuffled apart from their multiply-adds, the
// attention's products ran at about a sixth of the core's float32 rate.
template <int B>
VIT_INLINE void weighted_rows(int64_t out_rows, const float* weights, int64_t weight_stride, int64_t weight_row,
                              const float* rows, int64_t row_stride, int64_t count, float* out, int64_t out_row) {
  constexpr int V = B * 16 / W, registers = W == 16 ? 16 : 8;
  constexpr int R = std::clamp(registers / V, 1, 8);
#define VIT_ROWS(S)                                                                                                    \
  weighted_rows<B, S>(weights + r * weight_row, weight_stride, weight_row, rows, row_stride, count, out + r * out_row, \
                      out_row)
  int64_t r = 0;
  for (; r + R <= out_rows; r += R) VIT_ROWS(R);
  if constexpr (R > 4) {
    if (r + 4 <= out_rows) VIT_ROWS(4), r += 4;
  }
  if constexpr (R > 2) {
    if (r + 2 <= out_rows) VIT_ROWS(2), r += 2;
  }
  if constexpr (R > 1) {
    if (r < out_rows) VIT_ROWS(1);
  }
#undef VIT_ROWS
}

// For count query rows: probabilities p (count, N) = softmax((scale q) k^T), out (count, hd; row stride ld) = p v.
// kT: scratch (hd, 16 KB).
template <int KB, int HB>
VIT_INLINE void short_attention_rows(const float* q, const float* k, const float* v, int64_t row, int64_t N,
                                     float scale, int64_t count, float* p, float* out, int64_t ld, float* kT) {
  constexpr int hd = 16 * HB, keys = 16 * KB, V = keys / W;
  transpose_padded<KB>(k, row, N, hd, kT);
  float scaled[64 * hd];  // (count, hd): timm's q * scale, rounded as it rounds
  for (int64_t i = 0; i < count; ++i) {
    for (int b = 0; b < hd / W; ++b) storev(scaled + i * hd + W * b, loadv(q + i * row + W * b) * scale);
  }
  float scores[64 * keys];  // (count, keys): count <= N <= 64 (short_attention_applies)
  weighted_rows<KB>(count, scaled, 1, hd, kT, keys, hd, scores, keys);  // (q * scale) @ k^T
  // Softmax over the N real keys, in registers: the padding's lanes count as -inf in the max, then as 0.
  vec pad[V], keep[V];
  for (int b = 0; b < V; ++b) {
    for (int l = 0; l < W; ++l) {
      const bool real = W * b + l < N;
      pad[b][l] = real ? 0.0f : -std::numeric_limits<float>::infinity();
      keep[b][l] = real ? 1.0f : 0.0f;
    }
  }
  for (int64_t i = 0; i < count; ++i) {
    float* si = scores + i * keys;
    vec x[V];
    x[0] = loadv(si);
    vec top = x[0] + pad[0];
    for (int b = 1; b < V; ++b) {
      x[b] = loadv(si + W * b);
      const vec masked = x[b] + pad[b];
      top = masked > top ? masked : top;
    }
    const float max = max_lanes(top);
    vec sums = {};
    for (int b = 0; b < V; ++b) {
      x[b] = exp_nonpositive(x[b] - max) * keep[b];
      sums += x[b];
    }
    const float inverse = 1.0f / sum_lanes(sums);
    for (int b = 0; b < V; ++b) storev(si + W * b, x[b] * inverse);
    std::copy(si, si + N, p + i * N);
  }
  weighted_rows<HB>(count, scores, 1, keys, v, row, N, out, ld);
}

// The backward of one head: dO (N, hd; row stride ld) -> dq, dk, dv (N, hd; row stride row), P (N, N) the saved
// probabilities. Scratch: vT (hd, 16 KB), ds (N, 16 KB).
template <int KB, int HB>
VIT_INLINE void short_attention_backward_rows(const float* P, const float* dO, int64_t ld, const float* q,
                                              const float* k, const float* v, int64_t row, int64_t N, float scale,
                                              float* dq, float* dk, float* dv, float* vT, float* ds) {
  constexpr int hd = 16 * HB, keys = 16 * KB;
  weighted_rows<HB>(N, P, N, 1, dO, ld, N, dv, row);  // dv_j = sum_i P_ij dO_i
  transpose_padded<KB>(v, row, N, hd, vT);
  weighted_rows<KB>(N, dO, 1, ld, vT, keys, hd, ds, keys);  // dP_i = dO_i v^T
  for (int64_t i = 0; i < N; ++i) {                         // dS_i = P_i (dP_i - P_i . dP_i)
    float* di = ds + i * keys;
    const float* pi = P + i * N;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j < N; ++j) dot += di[j] * pi[j];
#pragma omp simd
    for (int64_t j = 0; j < N; ++j) di[j] = scale * pi[j] * (di[j] - dot);  // scale folded in: dq, dk need it
  }
  weighted_rows<HB>(N, ds, 1, keys, k, row, N, dq, row);  // scale sum_j dS_ij k_j
  weighted_rows<HB>(N, ds, keys, 1, q, row, N, dk, row);  // scale sum_i dS_ij q_i
}

// CALL(KB, HB) with the block counts of N tokens and head dimension hd (short_attention_applies).
#define VIT_SHORT_ATTENTION_DISPATCH(N, hd, CALL)                           \
  switch (((N) + 15) / 16 * 8 + (hd) / 16) {                                \
    case 1 * 8 + 1:                                                         \
      CALL(1, 1);                                                           \
      break;                                                                \
    case 1 * 8 + 2:                                                         \
      CALL(1, 2);                                                           \
      break;                                                                \
    case 1 * 8 + 4:                                                         \
      CALL(1, 4);                                                           \
      break;                                                                \
    case 2 * 8 + 1:                                                         \
      CALL(2, 1);                                                           \
      break;                                                                \
    case 2 * 8 + 2:                                                         \
      CALL(2, 2);                                                           \
      break;                                                                \
    case 2 * 8 + 4:                                                         \
      CALL(2, 4);                                                           \
      break;                                                                \
    case 3 * 8 + 1:                                                         \
      CALL(3, 1);                                                           \
      break;                                                                \
    case 3 * 8 + 2:                                                         \
      CALL(3, 2);                                                           \
      break;                                                                \
    case 3 * 8 + 4:                                                         \
      CALL(3, 4);                                                           \
      break;                                                                \
    case 4 * 8 + 1:                                                         \
      CALL(4, 1);                                                           \
      break;                                                                \
    case 4 * 8 + 2:                                                         \
      CALL(4, 2);                                                           \
      break;                                                                \
    case 4 * 8 + 4:                                                         \
      CALL(4, 4);                                                           \
      break;                                                                \
    default:                                                                \
      throw std::logic_error("short attention: no kernel for these sizes"); \
  }

void short_attention(const float* q, const float* k, const float* v, int64_t row, int64_t N, int64_t hd, float scale,
                     int64_t count, float* p, float* out, int64_t ld, float* kT) {
#define VIT_CALL(KB, HB) short_attention_rows<KB, HB>(q, k, v, row, N, scale, count, p, out, ld, kT)
  VIT_SHORT_ATTENTION_DISPATCH(N, hd, VIT_CALL)
#undef VIT_CALL
}

void short_attention_backward(const float* P, const float* dO, int64_t ld, const float* q, const float* k,
                              const float* v, int64_t row, int64_t N, int64_t hd, float scale, float* dq, float* dk,
                              float* dv, float* vT, float* ds) {
#define VIT_CALL(KB, HB) short_attention_backward_rows<KB, HB>(P, dO, ld, q, k, v, row, N, scale, dq, dk, dv, vT, ds)
  VIT_SHORT_ATTENTION_DISPATCH(N, hd, VIT_CALL)
#undef VIT_CALL
}

}  // namespace
}  // namespace vit::VIT_ROW_KERNELS_ISA

#include "model/int8_kernels_impl.h"

namespace vit::VIT_ROW_KERNELS_ISA {

RowKernels table(const char* isa) {
  // clang-format off
  return {isa,           &layer_norm_row,        &layer_norm_backward_row, &rms_norm_row,
          &rms_norm_backward_row, &add_branch_row, &branch_backward_row,   &add_row,
          &softmax_rows, &softmax_backward_rows, &short_attention,         &short_attention_backward,
          &quantize_row, &quantize_row_u8,       &int8_dequantize_row,     &int8_linear,
          kInt8PairsIn16Bits,                    &round_bf16_row,          &gelu_with_derivative};
  // clang-format on
}

}  // namespace vit::VIT_ROW_KERNELS_ISA

#undef VIT_INLINE
