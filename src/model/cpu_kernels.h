// CPU float32 fast paths for the model's two hot spots, taken only where they apply:
//  - linear layers through oneDNN's sgemm, which uses AVX-512 where the CPU has it (OpenBLAS, behind ATen's
//    matmul on Debian, stops at AVX2: half the FLOP rate on an AVX-512 core), and
//  - the attention core read straight out of the fused qkv projection: no q/k/v copies, heads in parallel.
// The sgemm is looked up at run time among the libraries loaded: the sgemm_ of the MKL inside PyTorch's wheel (which
// keeps its oneDNN private), else oneDNN's dnnl_sgemm (Debian's libtorch links libdnnl); without either every call
// falls back to ATen. Both paths compute the same float32 products; only rounding differs.
//
// Shape key: B batch, N tokens, D embed dim, nh heads, hd head dim (D / nh).
#pragma once

#include <torch/torch.h>

namespace vit {

// True when the fast CPU kernels are usable in this process: oneDNN's sgemm was found and the environment does not
// say VIT_CPU_KERNELS=aten (which forces the ATen path, for comparisons).
bool cpu_kernels_available();

// True when MKL's BLAS is loaded in this process (PyTorch's wheel links it statically): then its sgemm is the one
// torch::mm runs and the one the fast path takes, even where OpenBLAS is loaded beside it (Debian's libdnnl and
// OpenCV pull it in).
bool mkl_blas_loaded();

// Whose sgemm the fast path runs: "MKL" (PyTorch's wheel), "oneDNN" (Debian's libtorch), or "none" (ATen's matmul).
const char* sgemm_library();

// Row-major C (M, N) = alpha op(A) op(B) + beta C through the sgemm found above (cpu_kernels_available() must be
// true); op 'N' or 'T'. Inside a parallel region it runs on the calling thread only.
void sgemm(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// y = x W^T + b for x (..., in), W (out, in), b (out) or undefined; differentiable. The fast path for CPU float32,
// torch::nn::functional::linear otherwise.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

// True when attention_core can take qkv: CPU float32, (B, N, 3D), kernels available.
bool attention_core_applies(const torch::Tensor& qkv);
// softmax(scale q k^T) v for every head, q/k/v read in place from qkv (B, N, 3D) in timm's fused layout
// (3, nh, hd) along the last dimension -> (B, N, D), heads concatenated as timm's transpose + reshape; differentiable.
torch::Tensor attention_core(const torch::Tensor& qkv, int64_t num_heads, double scale);

}  // namespace vit
