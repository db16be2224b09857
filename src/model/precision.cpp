// int8 and bf16 linear layers on the CPU (model/precision.h): the products through oneDNN's matmul
// (model/dnnl_matmul.h), the quantization of each row and the scaling back through the row kernels.
#include "model/precision.h"

#include <ATen/Parallel.h>

#include <stdexcept>
#include <string>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "model/row_kernels.h"
#include "vit/build_config.h"

#if VIT_WITH_DNNL
#include "model/dnnl_matmul.h"
#endif

namespace vit {
namespace {

// CPUID leaf 7 (sub-leaves 0 and 1) straight, since clang 14's __builtin_cpu_supports knows no AMX or AVX-VNNI names.
bool cpu_has(const char* feature) {
#if defined(__x86_64__)
  unsigned a0 = 0, b0 = 0, c0 = 0, d0 = 0, a1 = 0, b1 = 0, c1 = 0, d1 = 0;
  if (__get_cpuid_count(7, 0, &a0, &b0, &c0, &d0) == 0) return false;
  __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1);
  const std::string name = feature;
  if (name == "avx512vnni") return (c0 >> 11) & 1u;
  if (name == "amx-bf16") return (d0 >> 22) & 1u;
  if (name == "amx-int8") return (d0 >> 25) & 1u;
  if (name == "avxvnni") return (a1 >> 4) & 1u;
  if (name == "avx512bf16") return (a1 >> 5) & 1u;
#endif
  (void)feature;
  return false;
}

[[maybe_unused]] bool cpu_has_bf16() { return cpu_has("avx512bf16") || cpu_has("amx-bf16"); }  // unused without oneDNN

}  // namespace

bool cpu_has_amx_bf16() { return cpu_has("amx-bf16"); }

std::string cpu_precision_features() {
  std::string features;
  auto add = [&](const char* name) { features += (features.empty() ? "" : ", ") + std::string(name); };
  if (cpu_has("amx-int8")) add("AMX int8");
  if (cpu_has("amx-bf16")) add("AMX bf16");
  if (cpu_has("avx512vnni")) add("AVX-512 VNNI");
  else if (cpu_has("avxvnni")) add("AVX-VNNI");
  if (cpu_has("avx512bf16")) add("AVX512_BF16");
  return features.empty() ? "no int8 or bf16 instructions" : features;
}

std::string precision_refusal(Precision precision, torch::DeviceType device) {
  if (precision == Precision::fp32) return {};
  const std::string name = name_of(precision);
  if (device == torch::kCUDA) {
    if (precision == Precision::int8) return "--precision int8 runs on the CPU only; on CUDA use fp16 or bf16";
    return {};
  }
  if (device != torch::kCPU) return "--precision " + name + " runs on the CPU or CUDA only";
  if (precision == Precision::fp16) {
    return "--precision fp16 is for CUDA; on the CPU use bf16 (or int8)";
  }
#if !VIT_WITH_DNNL
  return "--precision " + name + " on the CPU needs oneDNN, which this vit was built without (install libdnnl-dev and "
         "rebuild)";
#else
  if (precision == Precision::bf16) {
    const auto refusal = cpu_bf16_refusal();
    if (!refusal.empty()) return "--precision bf16 " + refusal + "; use int8 or fp32";
  }
  return {};
#endif
}

std::string cpu_bf16_refusal() {
#if !VIT_WITH_DNNL
  return "needs oneDNN, which this vit was built without (install libdnnl-dev and rebuild)";
#else
  if (!cpu_has_bf16()) return "needs a CPU with AVX512_BF16 or AMX (this one has " + cpu_precision_features() + ")";
  return {};
#endif
}

std::pair<torch::Tensor, torch::Tensor> quantize_weight_int8(const torch::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2, "quantize_weight_int8: weight must be (N, K), got ", weight.sizes());
  const auto w = weight.detach().to(torch::kCPU, torch::kFloat).contiguous();
  const int64_t N = w.size(0), K = w.size(1);
  auto q = torch::empty({N, K}, torch::kChar);
  auto scales = torch::empty({N}, torch::kFloat);
  const auto& kernels = row_kernels();
  const float* src = w.data_ptr<float>();
  int8_t* dst = q.data_ptr<int8_t>();
  float* scale = scales.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) scale[n] = kernels.quantize_row(src + n * K, K, dst + n * K);
  });
  return {q, scales};
}

#if VIT_WITH_DNNL

// Elements per thread below which the row passes (quantize, scale back) stay on the calling thread: a parallel region
// costs microseconds, a vectorized pass over 128K floats about as much.
constexpr int64_t kRowGrain = int64_t{1} << 17;

struct PackedLinear::State {
  Precision precision;
  int64_t N = 0, K = 0;
  torch::Tensor weight;  // (N, K) int8 or bf16: the copy weight_bytes counts (the matmul keeps its own)
  torch::Tensor scales;  // int8: (N) float32
  torch::Tensor bias;    // (N) float32 or undefined
  std::unique_ptr<DnnlMatmul> matmul;

  void make_matmul() {
    const bool int8 = precision == Precision::int8;
    matmul = std::make_unique<DnnlMatmul>(int8 ? MatmulType::int8 : MatmulType::bf16, N, K, weight.data_ptr(),
                                          int8 ? scales.data_ptr<float>() : nullptr);
  }
};

PackedLinear::PackedLinear(const torch::Tensor& weight, const torch::Tensor& bias, Precision precision)
    : state_(std::make_unique<State>()) {
  TORCH_CHECK(weight.dim() == 2, "PackedLinear: weight must be (N, K), got ", weight.sizes());
  if (precision != Precision::int8 && precision != Precision::bf16) {
    throw std::invalid_argument(std::string("PackedLinear: precision ") + name_of(precision) + " is not int8 or bf16");
  }
  auto& s = *state_;
  s.precision = precision;
  s.N = weight.size(0), s.K = weight.size(1);
  if (precision == Precision::int8) {
    std::tie(s.weight, s.scales) = quantize_weight_int8(weight);
  } else {
    s.weight = weight.detach().to(torch::kCPU, torch::kBFloat16).contiguous();
  }
  if (bias.defined()) s.bias = bias.detach().to(torch::kCPU, torch::kFloat).contiguous();
  s.make_matmul();
}

PackedLinear::~PackedLinear() = default;

Precision PackedLinear::precision() const { return state_->precision; }

int64_t PackedLinear::weight_bytes() const {
  const auto& s = *state_;
  int64_t bytes = s.weight.numel() * static_cast<int64_t>(s.weight.element_size());
  if (s.scales.defined()) bytes += s.scales.numel() * 4;
  if (s.bias.defined()) bytes += s.bias.numel() * 4;
  return bytes;
}

torch::Tensor PackedLinear::forward(const torch::Tensor& x) const {
  const auto& s = *state_;
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat && x.size(-1) == s.K,
              "PackedLinear: input must be CPU float32 (..., ", s.K, "), got ", x.sizes(), " ", x.dtype());
  torch::NoGradGuard no_grad;
  auto out_shape = x.sizes().vec();
  out_shape.back() = s.N;
  const auto rows = x.reshape({-1, s.K}).contiguous();
  const int64_t M = rows.size(0), K = s.K, N = s.N;
  auto out = torch::empty({M, N}, torch::kFloat);
  if (M == 0) return out.view(out_shape);
  if (s.precision == Precision::bf16) {
    const auto input = rows.to(torch::kBFloat16);
    s.matmul->run(M, input.data_ptr(), out.data_ptr(), s.bias.defined() ? s.bias.data_ptr<float>() : nullptr);
    return out.view(out_shape);
  }
  // int8: each row quantized with its own scale; oneDNN scales the int32 products by the weight's column scales into
  // float32, then each row by its own scale (and the bias is added) in place.
  const auto& kernels = row_kernels();
  auto input = torch::empty({M, K}, torch::kChar);
  auto row_scales = torch::empty({M}, torch::kFloat);
  const float* x_data = rows.data_ptr<float>();
  int8_t* q = input.data_ptr<int8_t>();
  float* rs = row_scales.data_ptr<float>();
  at::parallel_for(0, M, std::max<int64_t>(1, kRowGrain / K), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) rs[r] = kernels.quantize_row(x_data + r * K, K, q + r * K);
  });
  float* y = out.data_ptr<float>();
  s.matmul->run(M, q, y, nullptr);
  const float* b = s.bias.defined() ? s.bias.data_ptr<float>() : nullptr;
  at::parallel_for(0, M, std::max<int64_t>(1, kRowGrain / N), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) kernels.scale_row(y + r * N, N, rs[r], b);
  });
  return out.view(out_shape);
}

#else  // !VIT_WITH_DNNL

struct PackedLinear::State {};

PackedLinear::PackedLinear(const torch::Tensor&, const torch::Tensor&, Precision precision) {
  throw std::invalid_argument(precision_refusal(precision, torch::kCPU));
}
PackedLinear::~PackedLinear() = default;
Precision PackedLinear::precision() const { return Precision::fp32; }
int64_t PackedLinear::weight_bytes() const { return 0; }
torch::Tensor PackedLinear::forward(const torch::Tensor&) const {
  throw std::logic_error("PackedLinear without oneDNN");
}

#endif

}  // namespace vit
