// Reduced precision for inference (`--precision`): int8 and bf16 linear layers on the CPU through oneDNN's matmul
// (AMX or AVX-512 VNNI / BF16 where the CPU has them), fp16 and bf16 autocast on CUDA. Everything that is not a linear
// layer (layer norm, softmax and the attention products, GELU, residuals) stays float32; so do gradients: a packed
// layer runs only where no gradient is recorded (explanation methods that take gradients run float32).
//
// int8: weights symmetric per output channel (scale_n = max|W_n| / 127), activations quantized per row on each call
// (scale_r = max|x_r| / 127), products accumulated in int32, then y = acc scale_r scale_n + bias in float32.
// bf16: weights and activations rounded to bfloat16, products accumulated in float32, the bias added in float32.
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
// CPU: int8 needs a build with oneDNN; bf16 also a CPU with AVX512_BF16 or AMX (never emulated, slowly); fp16 is
// refused (bf16 is the CPU's half type). CUDA: fp16 and bf16 (bf16 from compute capability 8.0); int8 is refused.
std::string precision_refusal(Precision precision, torch::DeviceType device);

// Why bfloat16 products (oneDNN's, model/dnnl_matmul.h) cannot run on this CPU in this build, in a few words ("needs
// a CPU with AVX512_BF16 or AMX (this one has ...)"); empty when they can. --precision bf16 and train.amp bf16 ask it.
std::string cpu_bf16_refusal();

// Whether this CPU has AMX's bfloat16 tiles: where bfloat16 products outrun float32 ones in training (with AVX512_BF16
// alone they ran at 0.62-0.76x float32's training speed on a Xeon whose AMX was hidden, whose VDPBF16PS does half the
// multiply-adds of its float32 FMAs: README, train.amp).
bool cpu_has_amx_bf16();

// The int8 and bf16 instructions this CPU has, as oneDNN uses them ("AMX int8/bf16", "AVX-512 VNNI", ...), for logs.
std::string cpu_precision_features();

// Symmetric per-output-channel int8 of a weight (N, K): {q (N, K) int8, scales (N) float32}, q = round(W / scale).
std::pair<torch::Tensor, torch::Tensor> quantize_weight_int8(const torch::Tensor& weight);

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
  Precision precision() const;
  // Bytes of the reduced-precision weight, its scales and the bias: what the layer's weights take in memory.
  int64_t weight_bytes() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace vit
