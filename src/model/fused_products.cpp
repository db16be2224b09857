// model/fused_products.h: the fused block's products, and PackedProducts' cache of packed weights
// (model/fused_block.h).
#include "model/fused_products.h"

#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/cpu_kernels.h"
#include "model/precision.h"
#include "model/row_kernels.h"
#include "vit/build_config.h"
#if VIT_WITH_DNNL
#include "model/dnnl_matmul.h"
#endif

namespace vit {
namespace {

using fused::data_or_null;

// Copies bias (cols) into every row of out (rows, cols; row stride ld) and returns the sgemm's beta: 1 with a bias,
// 0 without. Row-parallel when called outside a parallel region (a wide plan's product on all rows).
float bias_rows(const float* bias, int64_t rows, int64_t cols, float* out, int64_t ld) {
  if (bias == nullptr) return 0.0f;
  at::parallel_for(0, rows, /*grain_size=*/16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) std::memcpy(out + i * ld, bias, cols * sizeof(float));
  });
  return 1.0f;
}

// The most inner values (in features) a float32 product not packed runs with through oneDNN's brgemm kernel, its bias
// inside the kernel (gemm_f32), rather than through sgemm after the bias copied into every row (beta = 1). Measured
// single-threaded, the Fashion-MNIST default's per-thread shapes (1,024 rows; 128 and 256 inner values): 0.88-0.93x
// sgemm's time; ViT-S/16's (1,576 rows; 384 and 1,536): 0.99-1.06x, so sgemm keeps those.
constexpr int64_t kBrgemmMaxInner = 256;

// Rounds rows (rows, cols; row stride ld) to bfloat16, to nearest even, into out (row stride out_ld), row-parallel
// when called outside a parallel region.
void round_rows(const float* in, int64_t rows, int64_t cols, int64_t ld, uint16_t* out, int64_t out_ld) {
  const auto round = row_kernels().round_bf16_row;
  at::parallel_for(0, rows, /*grain_size=*/64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) round(in + r * ld, cols, out + r * out_ld);
  });
}

uint16_t* bf16_bits(const torch::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); }

// The running thread's bfloat16 scratch, grown to the largest size asked and kept.
uint16_t* scratch_bf16(int64_t count) {
  thread_local std::vector<uint16_t> buffer;
  if (static_cast<int64_t>(buffer.size()) < count) buffer.resize(count);
  return buffer.data();
}

#if VIT_WITH_DNNL
// The activation as a oneDNN epilogue: the same functions (QuickGELU is swish at 1.702), within float32 rounding.
Epilogue epilogue_of(Activation act) {
  switch (act) {
    case Activation::gelu:
      return {Epilogue::gelu_erf};
    case Activation::gelu_tanh:
      return {Epilogue::gelu_tanh};
    case Activation::quick_gelu:
      return {Epilogue::swish, 1.702f};
    case Activation::silu:
      return {Epilogue::swish, 1.0f};
  }
  throw std::logic_error("fused block: activation " + std::to_string(static_cast<int>(act)) + " is unknown");
}
#endif

}  // namespace

struct PackedProducts::State {
  struct Entry {
    torch::Tensor weight;  // held, so that no other tensor gets its data's address while the entry lives
    int64_t version = 0;
#if VIT_WITH_DNNL
    std::unique_ptr<DnnlMatmul> matmul;
#endif
  };
  std::mutex mutex;
  std::vector<Entry> entries;  // one per weight data seen
  int64_t packs = 0;

#if VIT_WITH_DNNL
  // The packed matmul of weight (N, K) contiguous float32, packed again if its version moved; null for a weight
  // without a version counter (an inference tensor: a change could not be seen).
  const DnnlMatmul* matmul(const torch::Tensor& weight) {
    if (weight.is_inference()) return nullptr;
    std::lock_guard<std::mutex> lock(mutex);
    const int64_t version = weight._version();
    auto found = std::find_if(entries.begin(), entries.end(), [&](const Entry& e) {
      return e.weight.data_ptr() == weight.data_ptr() && e.weight.sizes() == weight.sizes();
    });
    if (found != entries.end() && found->version == version) return found->matmul.get();
    if (found == entries.end()) {
      // Forget the weights no one else holds any more (a model's tensors replaced, not changed in place): no other
      // handle on the tensor, no other tensor (a view's base) on its data.
      entries.erase(std::remove_if(entries.begin(), entries.end(),
                                   [](const Entry& e) {
                                     return e.weight.use_count() == 1 && e.weight.storage().use_count() == 1;
                                   }),
                    entries.end());
      found = entries.insert(entries.end(), Entry{});
    }
    found->weight = weight, found->version = version;
    found->matmul = std::make_unique<DnnlMatmul>(MatmulType::f32, weight.size(0), weight.size(1), weight.data_ptr());
    ++packs;
    return found->matmul.get();
  }
#endif
};

PackedProducts::PackedProducts() : state_(std::make_unique<State>()) {}
PackedProducts::~PackedProducts() = default;

bool PackedProducts::available() {
#if VIT_WITH_DNNL
  static const bool available = [] {
    const char* value = std::getenv("VIT_PACKED_PRODUCTS");
    return (value == nullptr || std::string(value) != "0") && DnnlMatmul::f32_packing_available();
  }();
  return available;
#else
  return false;
#endif
}

int64_t PackedProducts::packs() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->packs;
}

namespace fused {

Products::Products(const BlockParameters& p, bool bf16, bool packed) {
  const std::array<const torch::Tensor*, 5> weights{&p.qkv_weight, &p.proj_weight, &p.fc1_weight, &p.fc1v_weight,
                                                    &p.fc2_weight};
  if (!p.int8.empty()) {
    TORCH_CHECK(!bf16 && !torch::GradMode::is_enabled(), "fused block: int8 products in inference only");
    for (const auto* weight : weights) {
      if (weight->numel() == 0) continue;
      const auto found = std::find_if(p.int8.begin(), p.int8.end(), [&](const auto& layer) { return layer->packs(*weight); });
      TORCH_CHECK(found != p.int8.end(), "fused block: no int8 layer for a weight ", weight->sizes());
      int8_.push_back(found->get());
    }
    return;
  }
  if (!bf16) {
#if VIT_WITH_DNNL
    if (!packed || p.packed == nullptr || !c10::InferenceMode::is_enabled() || !PackedProducts::available()) return;
    const bool gated = p.fc1v_weight.numel() > 0;  // its fc1 products write strided rows: linear_rows
    for (const auto* weight : weights) {
      if (weight->numel() == 0 || (gated && (weight == &p.fc1_weight || weight == &p.fc1v_weight))) continue;
      if (const DnnlMatmul* matmul = p.packed->state().matmul(*weight)) {
        packed_.emplace_back(weight->data_ptr<float>(), matmul);
      }
    }
#endif
    return;
  }
#if VIT_WITH_DNNL
  for (const auto* weight : weights) {
    if (weight->numel() > 0) rounded_.emplace_back(weight->data_ptr<float>(), weight->detach().to(torch::kBFloat16));
  }
#else
  TORCH_CHECK(false, "fused block: bf16 products need oneDNN, which this vit was built without");
#endif
}

bool Products::packed(const torch::Tensor& weight) const { return packed_matmul(weight) != nullptr; }

const DnnlMatmul* Products::packed_matmul(const torch::Tensor& weight) const {
  for (const auto& [data, matmul] : packed_) {
    if (data == weight.data_ptr<float>()) return matmul;
  }
  return nullptr;
}

torch::Tensor Products::kept(bool training, int64_t rows, int64_t width) const {
  return bf16() && training ? torch::empty({rows, width}, torch::TensorOptions().dtype(torch::kBFloat16))
                            : torch::Tensor();
}

uint16_t* Products::row_of(const torch::Tensor& kept, int64_t r0) {
  return kept.defined() ? bf16_bits(kept) + r0 * kept.size(1) : nullptr;
}

void Products::linear_rows(int64_t r0, int64_t r1, const float* in, const torch::Tensor& weight,
                           const torch::Tensor& bias, float* out, int64_t ld, uint16_t* in16,
                           const Activation* act) const {
  const int64_t out_features = weight.size(0), in_features = weight.size(1), rows = r1 - r0;
  if (ld == 0) ld = out_features;
  for (const PackedLinear* layer : int8_) {
    if (!layer->packs(weight)) continue;
    TORCH_CHECK(act == nullptr, "fused block: an activation asked of an int8 product");
    layer->forward_rows(in, rows, out, ld, data_or_null(bias));
    return;
  }
#if VIT_WITH_DNNL
  // Dense output rows only (DnnlMatmul's): a gated MLP's two fc1 products, whose rows are strided, are not packed.
  if (const DnnlMatmul* matmul = packed_matmul(weight)) {
    TORCH_CHECK(ld == out_features, "fused block: a packed product with strided output rows");
    matmul->run(rows, in, out, data_or_null(bias), at::in_parallel_region(),
                act != nullptr ? epilogue_of(*act) : Epilogue{});
    return;
  }
#endif
  TORCH_CHECK(act == nullptr, "fused block: an activation asked of a product that is not packed");
  if (rounded_.empty()) {
#if VIT_WITH_DNNL
    if (in_features <= kBrgemmMaxInner && ld == out_features &&
        gemm_f32('N', 'T', rows, out_features, in_features, 1.0f, in, in_features, weight.data_ptr<float>(),
                 in_features, 0.0f, out, ld, data_or_null(bias))) {
      return;
    }
#endif
    const float beta = bias_rows(data_or_null(bias), rows, out_features, out, ld);
    sgemm('N', 'T', rows, out_features, in_features, 1.0f, in, in_features, weight.data_ptr<float>(), in_features, beta,
          out, ld);
    return;
  }
#if VIT_WITH_DNNL
  if (in16 == nullptr) in16 = scratch_bf16(rows * in_features);
  round_rows(in, rows, in_features, in_features, in16, in_features);
  // The bias inside the kernel: copying it into the rows first (as sgemm's beta = 1 needs) cost 5% of a step.
  gemm_bf16('N', 'T', rows, out_features, in_features, 1.0f, in16, in_features, rounded(weight), in_features, 0.0f, out,
            ld, data_or_null(bias));
#endif
}

void Products::backward_rows(int64_t r0, int64_t r1, const float* dy, const torch::Tensor& weight, float* dx,
                             int64_t ld, float beta, uint16_t* dy16) const {
  const int64_t out_features = weight.size(0), in_features = weight.size(1), rows = r1 - r0;
  if (ld == 0) ld = out_features;
  if (rounded_.empty()) {
    sgemm('N', 'N', rows, in_features, out_features, 1.0f, dy, ld, weight.data_ptr<float>(), in_features, beta, dx,
          in_features);
    return;
  }
#if VIT_WITH_DNNL
  const int64_t ld16 = dy16 == nullptr ? out_features : ld;
  if (dy16 == nullptr) dy16 = scratch_bf16(rows * out_features);
  round_rows(dy, rows, out_features, ld, dy16, ld16);
  gemm_bf16('N', 'N', rows, in_features, out_features, 1.0f, dy16, ld16, rounded(weight), in_features, beta, dx,
            in_features);
#endif
}

torch::Tensor Products::weight_grad(const float* dout, const torch::Tensor& in, const torch::Tensor& weight, int64_t ld,
                                    const uint16_t* dout16, const uint16_t* in16) const {
  if (!weight.requires_grad()) return {};
  auto grad = torch::empty(weight.sizes(), in.options());
  weight_grad_rows(0, in.size(0), dout, in, weight, ld, dout16, in16, 0.0f, grad.data_ptr<float>());
  return grad;
}

void Products::weight_grad_rows(int64_t r0, int64_t r1, const float* dout, const torch::Tensor& in,
                                const torch::Tensor& weight, int64_t ld, const uint16_t* dout16, const uint16_t* in16,
                                float beta, float* grad) const {
  const int64_t out_features = weight.size(0), in_features = weight.size(1), rows = r1 - r0;
  if (ld == 0) ld = out_features;
  if (rounded_.empty()) {
    sgemm('T', 'N', out_features, in_features, rows, 1.0f, dout + r0 * ld, ld, in.data_ptr<float>() + r0 * in_features,
          in_features, beta, grad, in_features);
    return;
  }
#if VIT_WITH_DNNL
  TORCH_CHECK(dout16 != nullptr && in16 != nullptr, "fused block: a bfloat16 weight gradient without its rows");
  gemm_bf16('T', 'N', out_features, in_features, rows, 1.0f, dout16 + r0 * ld, ld, in16 + r0 * in_features, in_features,
            beta, grad, in_features);
#endif
}

const uint16_t* Products::rounded(const torch::Tensor& weight) const {
  for (const auto& [data, copy] : rounded_) {
    if (data == weight.data_ptr<float>()) return bf16_bits(copy);
  }
  TORCH_CHECK(false, "fused block: no bfloat16 copy of a weight ", weight.sizes());
}

}  // namespace fused
}  // namespace vit
