// The int8 kernels of model/row_kernels.h (quantizing a row, vit's own int8 product, back to float32), included by
// row_kernels_impl.h once per instruction set, in its namespace.
//
// Shape key: M rows, K in features, N out features, K4 = K rounded up to 4; a tile is up to 4 rows by one panel of 16
// output channels.
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace vit::VIT_ROW_KERNELS_ISA {
namespace {

// Rounds |v| < 2^22 to the nearest integer, ties to even, by adding and subtracting 1.5 * 2^23 (exact in float's
// round-to-nearest-even): it vectorizes where nearbyint does not.
VIT_INLINE float round_even(float v) { return (v + 12582912.0f) - 12582912.0f; }

// Symmetric int8 over one row: scale = max|x| / max_level (1 for an all-zero row), q = round-half-even(x / scale).
// GCC 12 vectorizes it with the restrict pointers, no simd pragma and no clamp for the stores.
float quantize_row(const float* x_in, int64_t n, int max_level, int8_t* q_out) {
  const float* __restrict x = x_in;
  int8_t* __restrict q = q_out;
  const float max_abs = n > 0 ? max_of<true>(x, n) : 0.0f;
  const float scale = max_abs > 0.0f ? max_abs / static_cast<float>(max_level) : 1.0f;
  const float inverse = 1.0f / scale;
  // |x| inverse <= max_level up to a rounding of the product, which the rounding to an integer absorbs: no clamp.
  for (int64_t j = 0; j < n; ++j) q[j] = static_cast<int8_t>(static_cast<int32_t>(round_even(x[j] * inverse)));
  return scale;
}

// Asymmetric uint8 over one row: the range [min(x, 0), max(x, 0)] in 255 steps, zero exact (model/row_kernels.h).
float quantize_row_u8(const float* x_in, int64_t n, uint8_t* q_out, int32_t* zero_point) {
  const float* __restrict x = x_in;
  uint8_t* __restrict q = q_out;
  const float hi = n > 0 ? std::max(max_of(x, n), 0.0f) : 0.0f;
  const float lo = n > 0 ? std::min(-max_of_negated(x, n), 0.0f) : 0.0f;
  const float scale = hi > lo ? (hi - lo) / 255.0f : 1.0f;
  const float inverse = 1.0f / scale;
  const float zero = std::min(std::max(round_even(-lo * inverse), 0.0f), 255.0f);
  *zero_point = static_cast<int32_t>(zero);
  for (int64_t j = 0; j < n; ++j) {
    const float v = round_even(x[j] * inverse) + zero;  // within [0, 255] but for the rounding of lo / scale
    q[j] = static_cast<uint8_t>(static_cast<int32_t>(std::min(std::max(v, 0.0f), 255.0f)));
  }
  return scale;
}

// y = float(acc - zero_point colsum) (row_scale col_scale) + bias over one row.
void int8_dequantize_row(const int32_t* acc, int64_t n, int32_t zero_point, const int32_t* colsum, float row_scale,
                         const float* col_scale, const float* bias, float* y) {
  if (bias != nullptr) {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) {
      y[j] = static_cast<float>(acc[j] - zero_point * colsum[j]) * (row_scale * col_scale[j]) + bias[j];
    }
  } else {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) {
      y[j] = static_cast<float>(acc[j] - zero_point * colsum[j]) * (row_scale * col_scale[j]);
    }
  }
}

// MR rows from r by panel p: the int32 products into acc (MR, 16).
template <int MR>
VIT_INLINE void int8_tile_products(const Int8Rows& a, int64_t r, const Int8Weight& w, int64_t p,
                                   int32_t (&acc)[MR][kInt8PanelWidth]) {
  const int64_t quads = w.K4 / 4;
  const int8_t* b = w.panels + p * quads * 4 * kInt8PanelWidth;
  const uint8_t* rows[MR];
  for (int i = 0; i < MR; ++i) rows[i] = a.q + (r + i) * a.lda;
#if defined(__AVX2__)
  // Per 4 k: the 4 activations of a row broadcast to 8 lanes, times 4 k of 8 channels (32 bytes of the panel):
  // vpmaddubsw sums pairs into 16 bits, vpmaddwd by 1 the two pairs of a lane into 32.
  __m256i sums[MR][2];
  for (int i = 0; i < MR; ++i) sums[i][0] = sums[i][1] = _mm256_setzero_si256();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t k = 0; k < quads; ++k, b += 4 * kInt8PanelWidth) {
    const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
    const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32));
    for (int i = 0; i < MR; ++i) {
      int32_t four;
      std::memcpy(&four, rows[i] + 4 * k, sizeof four);
      const __m256i x = _mm256_set1_epi32(four);
      sums[i][0] = _mm256_add_epi32(sums[i][0], _mm256_madd_epi16(_mm256_maddubs_epi16(x, b0), ones));
      sums[i][1] = _mm256_add_epi32(sums[i][1], _mm256_madd_epi16(_mm256_maddubs_epi16(x, b1), ones));
    }
  }
  for (int i = 0; i < MR; ++i) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc[i]), sums[i][0]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc[i] + 8), sums[i][1]);
  }
#else
  for (int i = 0; i < MR; ++i) std::fill(acc[i], acc[i] + kInt8PanelWidth, 0);
  for (int64_t k = 0; k < quads; ++k, b += 4 * kInt8PanelWidth) {
    for (int i = 0; i < MR; ++i) {
      const uint8_t* x = rows[i] + 4 * k;
      for (int c = 0; c < kInt8PanelWidth; ++c) {
        const int8_t* wc = b + 4 * c;
        acc[i][c] += int32_t{x[0]} * wc[0] + int32_t{x[1]} * wc[1] + int32_t{x[2]} * wc[2] + int32_t{x[3]} * wc[3];
      }
    }
  }
#endif
}

// MR rows from r by panel p, products and back to float32, into y's columns of the panel that exist.
template <int MR>
void int8_tile(const Int8Rows& a, int64_t r, const Int8Weight& w, int64_t p, float* y, int64_t ldy) {
  int32_t acc[MR][kInt8PanelWidth];
  int8_tile_products<MR>(a, r, w, p, acc);
  const int64_t c0 = p * kInt8PanelWidth, count = std::min(kInt8PanelWidth, w.N - c0);
  for (int i = 0; i < MR; ++i) {
    int8_dequantize_row(acc[i], count, a.zero_point[r + i], w.colsum + c0, a.scale[r + i], w.scale + c0,
                        w.bias != nullptr ? w.bias + c0 : nullptr, y + (r + i) * ldy + c0);
  }
}

// Panels [p0, p1) by all rows, one panel (16 channels x K4, at most 24 KiB for K = 1536: in L1) against 4 rows at a
// time.
void int8_linear(const Int8Rows& a, const Int8Weight& w, int64_t p0, int64_t p1, float* y, int64_t ldy) {
  for (int64_t p = p0; p < p1; ++p) {
    int64_t r = 0;
    for (; r + 4 <= a.rows; r += 4) int8_tile<4>(a, r, w, p, y, ldy);
    switch (a.rows - r) {
      case 3: int8_tile<3>(a, r, w, p, y, ldy); break;
      case 2: int8_tile<2>(a, r, w, p, y, ldy); break;
      case 1: int8_tile<1>(a, r, w, p, y, ldy); break;
      default: break;
    }
  }
}

#if defined(__AVX2__)
constexpr bool kInt8PairsIn16Bits = true;
#else
constexpr bool kInt8PairsIn16Bits = false;
#endif

}  // namespace
}  // namespace vit::VIT_ROW_KERNELS_ISA
