// The fused block's element-wise and short-attention kernels and bfloat16 rounding (model/fused_block.cpp) and int8
// inference's quantize and scale rows (model/precision.cpp), compiled three times: for
// AVX-512, for AVX2 + FMA and for the x86-64 baseline (model/row_kernels_*.cpp), the one this CPU runs chosen once at
// run time. Plain loops the compiler vectorizes; no LibTorch in these units.
//
// Shape key: N tokens, D width, hd head dim; `row` is the row stride of q, k, v read in place from qkv (3D).
#pragma once

#include <cstdint>
#include <vector>

namespace vit {

// Whether the short-attention kernels cover N tokens of head dimension hd: at most 64 tokens, hd 16, 32 or 64.
// Below that an sgemm call costs more than its product.
inline bool short_attention_applies(int64_t N, int64_t hd) { return N <= 64 && (hd == 16 || hd == 32 || hd == 64); }

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

  // int8 inference (model/precision.h). quantize_row: symmetric int8 of one row of n, q = round(x / scale) with
  // scale = max|x| / 127 (1 for an all-zero row), returned. scale_row: y = y row_scale + bias (bias null for none) in
  // place over one row of n.
  float (*quantize_row)(const float* x, int64_t n, int8_t* q);
  void (*scale_row)(float* y, int64_t n, float row_scale, const float* bias);
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
