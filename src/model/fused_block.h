// The transformer block on the CPU as one unit, forward and backward: at most three parallel regions each way instead
// of one or more per operator, and one where the images split evenly over the threads (each thread takes its own
// images through the whole block) or, in inference with up to 4 MB of weights a block, where they do not (batch 1:
// each thread its own rows, one barrier before the attention). Rows are split over the threads for the layer norms and
// the products (each thread runs its own single-threaded sgemm on its rows), (image, head) pairs for attention, whose
// softmax stays in cache; layer norm is fused with the residual add, bias and activation run on a product's output
// while it is still in cache, and the backward is written out (weight gradients as each thread's product over its own
// rows, summed after the region, where the images split evenly; otherwise as whole-batch products after the regions).
//
// It covers timm's pre-norm block with LayerNorm or RmsNorm, LayerScale or not, every bias present or not, the four
// activations, a plain or gated (SwiGLU) MLP, rotary position embeddings (Eva's, given as a table) and stochastic
// depth; BlockImpl falls back to the per-operator path for everything else (model/layers.cpp says which).
//
// Shape key: B batch, N tokens, D embed dim, nh heads, hd head dim (D / nh), Hd MLP hidden width, R = B*N rows.
#pragma once

#include <memory>
#include <vector>

#include <torch/torch.h>

#include "config/model_config.h"

namespace vit {

class PackedLinear;

// Float32 inference's products with their weights packed once for oneDNN's brgemm kernels and the bias added inside
// the kernel, in place of sgemm on the plain weights after copying the bias into the output rows. A block keeps one
// across its calls (BlockParameters::packed); a weight whose data or version changed is packed again. Used under
// c10::InferenceMode only (predict, embed, serve, bench's inference: never inside training, whose optimizer writes
// the weights through a flat buffer), where oneDNN has those kernels for this CPU (AVX-512) and VIT_PACKED_PRODUCTS
// is not 0. Costs a packed copy of the block's product weights.
class PackedProducts {
 public:
  PackedProducts();
  ~PackedProducts();
  PackedProducts(const PackedProducts&) = delete;
  PackedProducts& operator=(const PackedProducts&) = delete;

  // False where this CPU has no such kernels, or VIT_PACKED_PRODUCTS=0.
  static bool available();
  // Weights packed so far, repacks included.
  int64_t packs() const;

  struct State;
  State& state() const { return *state_; }

 private:
  std::unique_ptr<State> state_;
};

// A block's parameters under timm's names. Every bias and gamma1/gamma2 (ls1, ls2) may be undefined: the norms'
// under RmsNorm, qkv_bias without qkv_bias, the others without proj_bias, the gammas without LayerScale. A gated MLP
// (SwiGLU) has its gates' rows in fc1 and its values' rows in fc1v (timm's fc1_g and fc1_x; a packed fc1's two
// halves); fc1v is undefined for a plain MLP.
struct BlockParameters {
  torch::Tensor norm1_weight, norm1_bias;  // (D)
  torch::Tensor qkv_weight, qkv_bias;      // (3D, D), (3D)
  torch::Tensor proj_weight, proj_bias;    // (D, D), (D)
  torch::Tensor gamma1;                    // (D)
  torch::Tensor norm2_weight, norm2_bias;  // (D)
  torch::Tensor fc1_weight, fc1_bias;      // (Hd, D), (Hd)
  torch::Tensor fc1v_weight, fc1v_bias;    // (Hd, D), (Hd)
  torch::Tensor fc2_weight, fc2_bias;      // (D, Hd), (D)
  torch::Tensor gamma2;                    // (D)
  // Rotary embeddings: sin then cos (hd each) for every patch token, shared by the heads (Np, 2 hd) or per head
  // (nh, Np, 2 hd), as RotaryEmbedding::embed gives them; undefined without. A table, not differentiated.
  torch::Tensor rope;
  // Where float32 inference keeps its packed weights between calls; null: sgemm on the plain weights.
  std::shared_ptr<PackedProducts> packed;
  // int8 inference (--precision int8, no gradients): the block's linear layers packed in int8 (model/precision.h),
  // each found by the float32 weight it was packed from; then every product runs in int8 and the rest of the block
  // in float32, as the per-operator path does. Empty otherwise.
  std::vector<std::shared_ptr<PackedLinear>> int8;
};

struct BlockShape {
  int64_t heads = 1;
  double scale = 1.0;  // attention's q scale, 1/sqrt(hd)
  double eps = 1e-6;   // both norms'
  Activation act = Activation::gelu;  // the MLP's, or a gated MLP's gates'
  NormLayer norm = NormLayer::layernorm;
  int64_t prefix = 0;        // tokens before the patch tokens that the rotary table rotates
  bool rotate_half = false;  // rotary pairs: channel i with i + hd/2, else 2i with 2i + 1 (model/rope.h)
  // The linear layers' products (qkv, proj, fc1, fc2, forward and backward) in bfloat16: inputs and weights rounded,
  // float32 accumulation (model/dnnl_matmul.h's gemm_bf16; AMX where the CPU has it), the rest of the block float32.
  // Needs oneDNN and a CPU with AVX512_BF16 or AMX (model/precision.h's cpu_bf16_refusal says why not).
  bool bf16 = false;
};

// False when the environment says VIT_FUSED_BLOCK=0 (every block then runs operator by operator, for comparisons).
bool fused_block_enabled();

// True when fused_block can run x (CPU float32 (B, N, D), non-empty) with these parameters (all CPU float32), the
// CPU kernels are available (model/cpu_kernels.h; VIT_CPU_KERNELS=aten turns them off) and fused_block_enabled().
bool fused_block_applies(const torch::Tensor& x, const BlockParameters& parameters);

// y = x + keep1 * gamma1 * attn(norm1(x)); out = y + keep2 * gamma2 * mlp(norm2(y)), as timm's Block (Eva's with
// a rotary table: the patch tokens' queries and keys rotated after qkv). mlp(z) is fc2(act(fc1(z))), or
// fc2(act(fc1(z)) * fc1v(z)) when gated. keep1, keep2: stochastic depth's per-image factors (B) (0 or 1 / keep
// probability), undefined for none. Differentiable in x and every parameter; the backward is explicit.
torch::Tensor fused_block(const torch::Tensor& x, const BlockParameters& parameters, const BlockShape& shape,
                          const torch::Tensor& keep1 = {}, const torch::Tensor& keep2 = {});

}  // namespace vit
