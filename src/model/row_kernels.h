// The fused block's element-wise and short-attention kernels and bfloat16 rounding (model/fused_block.cpp) and int8
// inference's kernels: quantizing rows, vit's own int8 product, the way back to float32 (model/precision.cpp),
// compiled three times: for AVX-512, for AVX2 + FMA and for the x86-64 baseline (model/row_kernels_*.cpp; the
// baseline alone on other CPUs), the one this CPU runs chosen once at run time. Plain loops the compiler vectorizes
// (the int8 product's AVX2 intrinsics, int8_kernels_impl.h, aside); no LibTorch in these units.
//
// Shape key: N tokens, D width, hd head dim; `row` is the row stride of q, k, v read in place from qkv (3D).
#pragma once

#include <cstdint>
#include <vector>

namespace vit {

// Whether the short-attention kernels cover N tokens of head dimension hd: at most 64 tokens, hd 16, 32 or 64.
// Below that an sgemm call costs more than its product.
inline bool short_attention_applies(int64_t N, int64_t hd) { return N <= 64 && (hd == 16 || hd == 32 || hd == 64); }

// int8 products' operands (RowKernels::int8_linear). Shape key: M rows, K in features, N out features, K4 = K rounded
// up to a multiple of 4.
// Activations quantized by quantize_row_u8, one row after another: q (M, K4; row stride lda >= K4, the K4 - K
// padding bytes zero), and per row its zero point and scale.
struct Int8Rows {
  const uint8_t* q;
  int64_t lda, rows;
  const int32_t* zero_point;  // (M)
  const float* scale;         // (M)
};
// A weight (N, K) quantized by quantize_row and packed by pack_int8_weight: panels of 16 output channels, each
// (K4 / 4, 16, 4) int8, so that one 32-byte load holds 4 consecutive k of 8 channels; channels past N and k past K
// are zero. Beside it per channel: the sum of its q (for the zero points), its scale and its bias.
struct Int8Weight {
  const int8_t* panels;   // (int8_panels(N), K4 / 4, 16, 4)
  int64_t N, K4;
  const int32_t* colsum;  // (N)
  const float* scale;     // (N)
  const float* bias;      // (N) or null
};
constexpr int64_t kInt8PanelWidth = 16;
inline int64_t int8_panels(int64_t N) { return (N + kInt8PanelWidth - 1) / kInt8PanelWidth; }
inline int64_t int8_k4(int64_t K) { return (K + 3) / 4 * 4; }
// Packs q (N, K) int8, row-major, into panels (int8_panels(N) * int8_k4(K) * 16 bytes) and writes colsum (N).
void pack_int8_weight(const int8_t* q, int64_t N, int64_t K, int8_t* panels, int32_t* colsum);

struct RowKernels {
  const char* isa;  // "avx512", "avx2", "baseline"

  // out = (x - mean) rstd w + b over one row of D; mean_out, rstd_out receive the row's statistics unless null.
  void (*layer_norm_row)(const float* x, int64_t D, float eps, const float* w, const float* b, float* out,
                         float* mean_out, float* rstd_out);
  // Layer norm's backward over one row: dx = base + rstd (g - mean(g) - xhat mean(g xhat)), g = dout w,
  // xhat = (x - mean) rstd; dw += dout xhat, db += dout.
  void (*layer_norm_backward_row)(const float* dout, const float* x, float mean, float rstd, const float* w, int64_t D,
                                  const float* base, float* dx, float* dw, float* db);
  // RmsNorm over one row of D: out = x rstd w, rstd = 1 / sqrt(mean(x^2) + eps), rstd_out receiving it unless null.
  void (*rms_norm_row)(const float* x, int64_t D, float eps, const float* w, float* out, float* rstd_out);
  // Its backward: dx = base + rstd (g - xhat mean(g xhat)), g = dout w, xhat = x rstd; dw += dout xhat.
  void (*rms_norm_backward_row)(const float* dout, const float* x, float rstd, const float* w, int64_t D,
                                const float* base, float* dx, float* dw);
  // out = base + branch gamma keep (gamma null without LayerScale): a residual add behind LayerScale and drop path.
  void (*add_branch_row)(const float* base, const float* branch, const float* gamma, float keep, int64_t D, float* out);
  // add_branch_row's backward towards the branch: dbranch = dout gamma keep; dgamma += dout keep branch (unless
  // null); dbias += dbranch.
  void (*branch_backward_row)(const float* dout, const float* branch, const float* gamma, float keep, int64_t D,
                              float* dbranch, float* dgamma, float* dbias);
  // acc += src over n floats.
  void (*add_row)(const float* src, int64_t n, float* acc);
  // Softmax over each of `rows` rows of `cols`, in place; and its backward in place over dp: p (dp - p . dp).
  void (*softmax_rows)(float* s, int64_t rows, int64_t cols);
  void (*softmax_backward_rows)(const float* p, float* dp, int64_t rows, int64_t cols);
  // One (image, head) for short sequences (short_attention_applies): for `count` query rows, p (count, N) =
  // softmax((scale q) k^T) and out (count, hd; row stride ld) = p v. Scratch kT: hd x 64 floats.
  void (*short_attention)(const float* q, const float* k, const float* v, int64_t row, int64_t N, int64_t hd,
                          float scale, int64_t count, float* p, float* out, int64_t ld, float* kT);
  // Its backward over all N query rows: dO (N, hd; row stride ld) and the saved P (N, N) -> dq, dk, dv (row stride
  // row). Scratch: vT hd x 64 floats, ds N x 64 floats.
  void (*short_attention_backward)(const float* P, const float* dO, int64_t ld, const float* q, const float* k,
                                   const float* v, int64_t row, int64_t N, int64_t hd, float scale, float* dq,
                                   float* dk, float* dv, float* vT, float* ds);

  // int8 products (model/precision.h). quantize_row: symmetric int8 of one row of n (a weight's output channel),
  // q = round(x / scale) with scale = max|x| / max_level (1 for an all-zero row), returned; max_level 127, or 63 where
  // the product kernel sums two products in 16 bits (int8_pairs_in_16_bits).
  float (*quantize_row)(const float* x, int64_t n, int max_level, int8_t* q);
  // quantize_row_u8: asymmetric uint8 of one row of n activations over [lo, hi] = [min(x, 0), max(x, 0)]:
  // scale = (hi - lo) / 255 (1 for an all-zero row), returned; zero_point = round(-lo / scale) in [0, 255];
  // q = clamp(round(x / scale) + zero_point, 0, 255), so x ~ (q - zero_point) scale and 0 is exact.
  float (*quantize_row_u8)(const float* x, int64_t n, uint8_t* q, int32_t* zero_point);
  // int8_dequantize_row: y = float(acc - zero_point colsum) (row_scale col_scale) + bias over one row of n (bias null
  // for none): an exact int32 product row of quantize_row_u8's q and a weight's q, back to float32.
  void (*int8_dequantize_row)(const int32_t* acc, int64_t n, int32_t zero_point, const int32_t* colsum,
                              float row_scale, const float* col_scale, const float* bias, float* y);
  // int8_linear: vit's own int8 product (for CPUs where oneDNN has no VNNI or AMX kernel): rows [0, a.rows) by the
  // columns of panels [p0, p1) of y (row stride ldy) = int8_dequantize_row of a.q (M, K4) times W^T. Accumulates in
  // int32 exactly where W's q are within int8_weight_max(): the AVX2 and AVX-512 versions sum two u8 x s8 products in
  // 16 bits (vpmaddubsw, 2 x 255 x 63 < 2^15), the baseline multiplies in 32 bits.
  void (*int8_linear)(const Int8Rows& a, const Int8Weight& w, int64_t p0, int64_t p1, float* y, int64_t ldy);
  bool int8_pairs_in_16_bits;  // int8_linear saturates above |q| = 63 in a weight
  // bfloat16 products (BlockShape::bf16): out = the 16 bits of x rounded to bfloat16, to nearest even, over n floats
  // (a NaN becomes the quiet NaN 0x7fc0), as c10::BFloat16 rounds.
  void (*round_bf16_row)(const float* x, int64_t n, uint16_t* out);

  // GELU (erf form) for training, over n floats: g = x Phi(x), and over x in place its derivative Phi(x) + x phi(x),
  // all the backward needs. One exp serves both; erf by Abramowitz and Stegun 7.1.26 (within 1.5e-7 of it).
  void (*gelu_with_derivative)(float* x, float* g, int64_t n);
};

// The kernels for this CPU: AVX-512 (F, VL, BW, DQ) where it has them, else AVX2 + FMA, else the baseline.
// VIT_CPU_ISA=avx2 or baseline picks a lower level (to compare them); a level the CPU lacks is refused.
const RowKernels& row_kernels();
// Every instruction set this build has and this CPU runs, best first (tests compare them).
std::vector<RowKernels> available_row_kernels();

}  // namespace vit
