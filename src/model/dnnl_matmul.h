// oneDNN's matmul behind a small torch-free interface (model/precision.cpp's int8 and bf16 layers, and the fused
// block's bf16 products in training, model/fused_block.cpp). A unit of its own
// in a library of its own: PyTorch's wheel ships oneDNN 3 headers among LibTorch's, while the library linked is
// Debian's oneDNN 2, so nothing that sees LibTorch's include folders may include dnnl.hpp.
//
// Shape key: M rows, K in features, N out features.
#pragma once

#include <cstdint>
#include <memory>

namespace vit {

enum class MatmulType {
  int8,  // A and W int8; C float32 = the int32 products times a scale per column
  bf16,  // A and W bfloat16 (its 16 bits as uint16_t), C float32 (+ a float32 bias)
};

// C (M, N) = A (M, K) W^T (x column_scales, + bias) for a weight W (N, K), row-major, fixed at construction (copied,
// with the int8 column scales). oneDNN chooses
// the kernel for this CPU (AMX, AVX-512 VNNI / BF16, ...); the weight is reordered into the layout that kernel reads
// once, and one primitive is kept per M. run() may be called from several threads.
class DnnlMatmul {
 public:
  // column_scales: (N) float32 for int8, null for bf16.
  DnnlMatmul(MatmulType type, int64_t N, int64_t K, const void* weight, const float* column_scales = nullptr);
  ~DnnlMatmul();
  DnnlMatmul(const DnnlMatmul&) = delete;
  DnnlMatmul& operator=(const DnnlMatmul&) = delete;

  // a: (M, K) int8 or bf16; c: (M, N) float32; bias: (N) float32 or null (bf16 only: int8's bias is added after the
  // caller's row scales).
  void run(int64_t M, const void* a, void* c, const float* bias) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Row-major C (M, N) = alpha op(A) op(B) (+ bias) + beta C, as sgemm (model/cpu_kernels.h), with A and B bfloat16
// (their 16 bits as uint16_t) and C float32: products accumulated in float32 by oneDNN's matmul (AMX or AVX512_BF16
// where the CPU has them; precision_refusal says whether it does). op(X) is X or its transpose ('N' / 'T'), read
// through the leading dimension, so no transpose is copied. One primitive per shape, made on first use and kept. Inside
// an OpenMP parallel region it runs on the calling thread alone, else on all of them; safe to call from several
// threads. bias: (N) float32 added to every row inside the kernel (alpha must be 1), or null.
void gemm_bf16(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda,
               const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc, const float* bias = nullptr);

}  // namespace vit
