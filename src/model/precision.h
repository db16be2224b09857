// Reduced precision for inference (`--precision`): int8 and bf16 linear layers on the CPU, fp16 and bf16 autocast on
// CUDA. Everything that is not a linear layer (layer norm, softmax and the attention products, GELU, residuals) stays
// float32; so do gradients: a packed layer runs only where no gradient is recorded (explanation methods that take
// gradients run float32).
//
// int8: activations asymmetric uint8 per row on each call (the row's range [min(x, 0), max(x, 0)] in 255 steps, a zero
// point per row), weights symmetric int8 per output channel (scale_n = max|W_n| / 127, or / 63 on CPUs without VNNI:
// int8_path()), products accumulated exactly in int32, then y = (acc - zero_point colsum) scale_r scale_n + bias in
// float32. The products run in oneDNN's matmul where it has a VNNI or AMX kernel, else in vit's own
// (model/row_kernels.h, int8_linear), which needs no oneDNN.
// bf16: weights and activations rounded to bfloat16, products accumulated in float32 by oneDNN (AVX512_BF16 or AMX),
// the bias added in float32.
//
// Shape key: M rows (batch x tokens), K in features, N out features.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include <torch/torch.h>

#include "config/enum_names.h"

namespace vit {

enum class Precision { fp32, int8, bf16, fp16 };
VIT_ENUM_NAMES(Precision, "fp32", "int8", "bf16", "fp16");

// Why this build and machine cannot run `precision` on a device of this type, in one line; empty when it can.
// CPU: int8 runs everywhere; bf16 needs a build with oneDNN and oneDNN's instruction set with AVX512_BF16 or AMX (never
// emulated, slowly); fp16 is refused (bf16 is the CPU's half type). CUDA: fp16 and bf16 (bf16 from compute capability
// 8.0); int8 is refused.
std::string precision_refusal(Precision precision, torch::DeviceType device);

// Why bfloat16 products (oneDNN's, model/dnnl_matmul.h) cannot run on this CPU in this build, in a few words ("needs
// a CPU with AVX512_BF16 or AMX (oneDNN runs avx2 here)"); empty when they can. --precision bf16 and train.amp bf16
// ask it. Decided by the instruction set oneDNN runs (its cap, ONEDNN_MAX_CPU_ISA, included), not by CPUID alone.
std::string cpu_bf16_refusal();

// Whether oneDNN runs AMX's bfloat16 tiles here: where bfloat16 products outrun float32 ones in training (with
// AVX512_BF16 alone they train more slowly than float32: VDPBF16PS does half the multiply-adds of float32's FMAs).
bool cpu_has_amx_bf16();

// The int8 and bf16 instructions this CPU has by CPUID ("AMX int8/bf16", "AVX-512 VNNI", ...), for logs.
std::string cpu_precision_features();

// How int8 products run in this process, decided once: oneDNN's matmul where its kernel multiplies uint8 by int8
// without a 16-bit intermediate (int8_products_exact: VNNI or AMX), with 8-bit weights; else vit's own int8_linear
// at the row kernels' instruction set (VIT_CPU_ISA), whose AVX2 and AVX-512 versions sum two products in 16 bits, so
// weights take 7 bits there (|q| <= 63, as onnxruntime's reduce_range), and whose baseline one multiplies in 32 bits.
struct Int8Path {
  bool onednn = false;  // oneDNN's matmul, else vit's int8_linear
  int weight_max = 127;  // a weight's largest |q|: 127, or 63
  std::string kernel;   // "oneDNN brg:avx512_core_vnni", "vit avx2", ...
};
const Int8Path& int8_path();

// How `precision` runs on the CPU here, in a few words, for logs and `vit info --system` ("int8: vit avx2 kernel,
// 7-bit weights (oneDNN avx2 has no VNNI)").
std::string precision_kernel(Precision precision);

// Symmetric per-output-channel int8 of a weight (N, K): {q (N, K) int8, scales (N) float32}, q = round(W / scale),
// scale = max|W_n| / max_level.
std::pair<torch::Tensor, torch::Tensor> quantize_weight_int8(const torch::Tensor& weight, int max_level = 127);

// A linear layer's weight prepared once for products in int8 or bf16 on the CPU (precision_refusal must be empty).
class PackedLinear {
 public:
  // From a float32 weight (N, K) and bias (N) or undefined; Precision::int8 or Precision::bf16.
  PackedLinear(const torch::Tensor& weight, const torch::Tensor& bias, Precision precision);
  ~PackedLinear();
  PackedLinear(const PackedLinear&) = delete;
  PackedLinear& operator=(const PackedLinear&) = delete;

  // (..., K) float32 -> (..., N) float32; not differentiable.
  torch::Tensor forward(const torch::Tensor& x) const;
  // int8 only: rows (M, K) float32 (row stride K) -> out (M, N; row stride ld) with `bias` (N, or null) added in place
  // of the layer's own (the fused block's qkv holds Eva's q_bias and v_bias there). Inside a parallel region it runs
  // on the calling thread alone, else on all of them. The fused CPU block's int8 products (model/fused_products.h).
  void forward_rows(const float* in, int64_t M, float* out, int64_t ld, const float* bias) const;
  // The float32 weight (N, K) this layer was packed from is `weight` (same data and shape): the fused block finds a
  // block's packed layers by their weights.
  bool packs(const torch::Tensor& weight) const;
  Precision precision() const;
  // Bytes of the reduced-precision weight, its scales and the bias: what the layer's weights take in memory.
  int64_t weight_bytes() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace vit
