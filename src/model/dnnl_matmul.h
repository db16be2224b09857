// oneDNN's matmul behind a small torch-free interface (model/precision.cpp's int8 and bf16 layers, the fused block's
// bf16 products in training and its packed float32 products in inference, model/fused_products.cpp). A unit of its own
// in a library of its own: PyTorch's wheel ships oneDNN 3 headers among LibTorch's, while the library linked is
// Debian's oneDNN 2, so nothing that sees LibTorch's include folders may include dnnl.hpp.
//
// Shape key: M rows, K in features, N out features.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace vit {

enum class MatmulType {
  int8,  // A uint8, W int8, C int32: the exact products (where int8_products_exact())
  bf16,  // A and W bfloat16 (its 16 bits as uint16_t), C float32 (+ a float32 bias)
  f32,   // A, W and C float32 (+ a float32 bias); W read where it is, not copied: it must outlive the matmul
};

// An element-wise function of C applied inside the kernel, after the bias (bf16 and f32): GELU in its erf or tanh
// form, or swish, x sigmoid(alpha x) (SiLU: alpha 1; QuickGELU: 1.702).
struct Epilogue {
  enum Kind { none, gelu_erf, gelu_tanh, swish } kind = none;
  float alpha = 0.0f;
};

// C (M, N) = A (M, K) W^T (+ bias) for a weight W (N, K), row-major, fixed at construction (copied, except float32's). oneDNN chooses the kernel for this CPU (AMX, AVX-512 VNNI / BF16,
// ...; for float32 its brgemm kernels, where it has them: f32_packing_available()); the weight is reordered into the
// layout that kernel reads once, and one primitive is kept per (M, bias or not, inside a parallel region or not,
// epilogue).
// run() may be called from several threads.
class DnnlMatmul {
 public:
  DnnlMatmul(MatmulType type, int64_t N, int64_t K, const void* weight);
  ~DnnlMatmul();
  DnnlMatmul(const DnnlMatmul&) = delete;
  DnnlMatmul& operator=(const DnnlMatmul&) = delete;

  // a: (M, K) uint8, bf16 or float32; c: (M, N) int32 (int8) or float32; bias: (N) float32 or null (bf16 and f32
  // only: int8's bias is added after the caller's scales). in_parallel_region: called inside an OpenMP parallel region, where the
  // primitive runs on the calling thread alone (oneDNN fixes a primitive's split over threads when it is made).
  // epilogue: applied to C in the kernel (not with int8).
  void run(int64_t M, const void* a, void* c, const float* bias, bool in_parallel_region = false,
           Epilogue epilogue = {}) const;

  // oneDNN's name for the kernel it runs M rows with (no bias, outside a parallel region): "brg:avx512_core_vnni", ...
  std::string kernel(int64_t M) const;

  // Whether oneDNN has a brgemm kernel for float32 matmul on this CPU (AVX-512): packed float32 weights pay off only
  // there, and only its brgemm kernels are safe beside PyTorch's wheel (gemm_bf16's comment says why).
  static bool f32_packing_available();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// oneDNN's version, "2.6.3".
std::string dnnl_version_text();

// The instruction set oneDNN runs its kernels with in this process: the CPU's, capped by ONEDNN_MAX_CPU_ISA (or
// DNNL_MAX_CPU_ISA), in oneDNN's words ("avx2", "avx512_core_vnni", "avx512_core_amx", ...).
const char* dnnl_cpu_isa();
// Whether oneDNN has bfloat16 products at that instruction set (AVX512_BF16 or AMX), and AMX's tiles.
bool dnnl_has_bf16();
bool dnnl_has_amx();
// Whether oneDNN's int8 matmul (MatmulType::int8) multiplies uint8 by int8 exactly with full 8-bit weights here: its
// kernel for this CPU and cap is a brgemm one (VNNI or AMX: no 16-bit intermediate), and a product whose pairs would
// saturate a 16-bit sum (255 x 127 x 2) comes out exact. Probed once. Without VNNI, oneDNN's int8 goes through its
// gemm kernels, which sum pairs in 16 bits (vpmaddubsw), and which in a process that also holds PyTorch's wheel do
// not run right (prefer_brgemm, dnnl_matmul.cpp).
bool int8_products_exact();

// Row-major C (M, N) = alpha op(A) op(B) (+ bias) + beta C, as sgemm (model/cpu_kernels.h), with A and B bfloat16
// (their 16 bits as uint16_t) and C float32: products accumulated in float32 by oneDNN's matmul (AMX or AVX512_BF16
// where the CPU has them; precision_refusal says whether it does). op(X) is X or its transpose ('N' / 'T'), read
// through the leading dimension, so no transpose is copied. One primitive per shape, made on first use and kept. Inside
// an OpenMP parallel region it runs on the calling thread alone, else on all of them; safe to call from several
// threads. bias: (N) float32 added to every row inside the kernel (alpha must be 1), or null.
void gemm_bf16(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda,
               const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc, const float* bias = nullptr);

// gemm_bf16 in float32 (A, B and C float32, dense rows only: leading dimension = row length) through oneDNN's brgemm
// kernels, whose gain over sgemm is the bias inside the kernel. Returns false, computing nothing, where oneDNN has no
// brgemm kernel for the product (a CPU without AVX-512): the caller's sgemm does it then.
bool gemm_f32(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc, const float* bias = nullptr);

}  // namespace vit
