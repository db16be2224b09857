// The fused block's linear layers' products, for its passes (model/fused_block.cpp): float32 through sgemm, float32
// on the block's packed weights in inference (PackedProducts' cache lives here too), or bfloat16 through oneDNN.
// Internal to the fused block.
//
// Shape key: R rows, in / out the layer's features.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "config/model_config.h"
#include "model/fused_block.h"

namespace vit {

class DnnlMatmul;
class PackedLinear;

namespace fused {

// A tensor's float32 data; null for an undefined or empty one (an absent bias or LayerScale).
inline const float* data_or_null(const torch::Tensor& t) {
  return t.defined() && t.numel() > 0 ? t.data_ptr<float>() : nullptr;
}
inline float* data_or_null(torch::Tensor& t) { return t.defined() && t.numel() > 0 ? t.data_ptr<float>() : nullptr; }

// How a pass runs its linear layers' products: in int8 where BlockParameters::int8 holds the block's layers (int8
// inference; PackedLinear::forward_rows on the calling thread's rows); float32 sgemm, or oneDNN's brgemm kernel with the bias inside it for a
// product of at most 256 inner values (gemm_f32, where the CPU has it); in inference, where BlockParameters::packed is
// set and PackedProducts::available(), oneDNN's float32 matmul on the packed weights; or, with BlockShape::bf16, in
// bfloat16 through gemm_bf16 (model/dnnl_matmul.h): each weight rounded once per pass, each input as a product reads
// it, float32 accumulation and output. Everything else in the block stays float32. A training pass keeps the rounded
// inputs (forward) and output gradients (backward) in whole-batch buffers (kept(), then the `*16` arguments), so that
// the weight gradients' products read them without rounding them again.
class Products {
 public:
  // packed: where a float32 pass may use the block's packed weights (Plan::packed).
  Products(const BlockParameters& p, bool bf16, bool packed);

  bool bf16() const { return !rounded_.empty(); }

  // Whether weight's products run on its packed float32 copy, where linear_rows can apply the activation in the
  // kernel.
  bool packed(const torch::Tensor& weight) const;
  // Whether the pass's products run in int8 (BlockParameters::int8).
  bool int8() const { return !int8_.empty(); }

  // A whole-batch buffer for rounded rows (rows, width) where products run in bfloat16 and the pass keeps what they
  // read (training); undefined otherwise.
  torch::Tensor kept(bool training, int64_t rows, int64_t width) const;
  // Row r0 of a kept() buffer, null for an undefined one.
  static uint16_t* row_of(const torch::Tensor& kept, int64_t r0);

  // rows (r1 - r0) of out (.., out_features; row stride ld, 0: out_features) = bias + in (.., in_features) W^T, out
  // and in starting at row r0. in16: where the rounded rows of in go (row stride in_features), null for scratch.
  // act: applied to out in the kernel, only where the weight is packed().
  void linear_rows(int64_t r0, int64_t r1, const float* in, const torch::Tensor& weight, const torch::Tensor& bias,
                   float* out, int64_t ld = 0, uint16_t* in16 = nullptr, const Activation* act = nullptr) const;

  // rows (r1 - r0) of dx (.., in_features) = beta dx + dy (.., out_features; row stride ld, 0: out_features) W, both
  // starting at row r0. dy16: where the rounded rows of dy go (row stride ld), null for scratch.
  void backward_rows(int64_t r0, int64_t r1, const float* dy, const torch::Tensor& weight, float* dx, int64_t ld = 0,
                     float beta = 0.0f, uint16_t* dy16 = nullptr) const;

  // The weight's gradient (out, in) = dout^T in over all R rows, a whole-batch product on every thread: dout (R,
  // out_features; row stride ld, 0: out_features), in (R, in_features). In bfloat16 it reads their rounded copies
  // kept by the passes, dout16 (row stride ld) and in16. Undefined where the weight needs none.
  torch::Tensor weight_grad(const float* dout, const torch::Tensor& in, const torch::Tensor& weight, int64_t ld,
                            const uint16_t* dout16, const uint16_t* in16) const;
  // The same product over rows [r0, r1) only: grad (out, in) = beta grad + dout[r0:r1]^T in[r0:r1], on the calling
  // thread alone inside a parallel region. dout, in, dout16 and in16 are the whole batch's, as for weight_grad.
  void weight_grad_rows(int64_t r0, int64_t r1, const float* dout, const torch::Tensor& in, const torch::Tensor& weight,
                        int64_t ld, const uint16_t* dout16, const uint16_t* in16, float beta, float* grad) const;

 private:
  // The rounded copy of a weight of this pass (found by its data, which the views and detached copies share).
  const uint16_t* rounded(const torch::Tensor& weight) const;
  // The packed matmul of a weight of this pass (found the same way), null where it has none.
  const DnnlMatmul* packed_matmul(const torch::Tensor& weight) const;

  std::vector<std::pair<const float*, torch::Tensor>> rounded_;     // (float32 data, its bfloat16 copy)
  std::vector<std::pair<const float*, const DnnlMatmul*>> packed_;  // (float32 data, its packed matmul)
  std::vector<const PackedLinear*> int8_;                            // each weight's int8 layer (int8 inference)
};

}  // namespace fused
}  // namespace vit
