// int8 and bf16 linear layers on the CPU (model/precision.h): the products through oneDNN's matmul
// (model/dnnl_matmul.h) or vit's own int8 kernel, the quantization of each row and the way back through the row
// kernels (model/row_kernels.h).
#include "model/precision.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

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

}  // namespace

bool cpu_has_amx_bf16() {
#if VIT_WITH_DNNL
  return dnnl_has_amx();
#else
  return false;
#endif
}

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
  if (precision == Precision::fp16) return "--precision fp16 is for CUDA; on the CPU use bf16 (or int8)";
  if (precision == Precision::bf16) {
    const auto refusal = cpu_bf16_refusal();
    if (!refusal.empty()) return "--precision bf16 " + refusal + "; use int8 or fp32";
  }
  return {};
}

std::string cpu_bf16_refusal() {
#if !VIT_WITH_DNNL
  return "needs oneDNN, which this vit was built without (install libdnnl-dev and rebuild)";
#else
  if (!dnnl_has_bf16()) {
    return std::string("needs a CPU with AVX512_BF16 or AMX (oneDNN runs ") + dnnl_cpu_isa() + " here; the CPU has " +
           cpu_precision_features() + ")";
  }
  return {};
#endif
}

const Int8Path& int8_path() {
  static const Int8Path path = [] {
    Int8Path chosen;
#if VIT_WITH_DNNL
    if (int8_products_exact()) {
      chosen.onednn = true;
      chosen.kernel = std::string("oneDNN ") + dnnl_cpu_isa();
      return chosen;
    }
#endif
    const auto& kernels = row_kernels();
    chosen.weight_max = kernels.int8_pairs_in_16_bits ? 63 : 127;
    chosen.kernel = std::string("vit ") + kernels.isa;
    return chosen;
  }();
  return path;
}

std::string precision_kernel(Precision precision) {
  const auto refusal = precision_refusal(precision, torch::kCPU);
  if (!refusal.empty()) return refusal;
  switch (precision) {
    case Precision::int8: {
      const auto& path = int8_path();
      std::string text = path.kernel + " kernel, " + (path.weight_max == 127 ? "8" : "7") + "-bit weights";
#if VIT_WITH_DNNL
      if (!path.onednn) text += std::string(" (oneDNN ") + dnnl_cpu_isa() + " has no VNNI or AMX int8 kernel)";
#else
      if (!path.onednn) text += " (built without oneDNN)";
#endif
      return text;
    }
#if VIT_WITH_DNNL
    case Precision::bf16: return std::string("oneDNN ") + dnnl_cpu_isa() + ", float32 accumulation";
#endif
    default: return "float32";
  }
}

std::pair<torch::Tensor, torch::Tensor> quantize_weight_int8(const torch::Tensor& weight, int max_level) {
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
    for (int64_t n = begin; n < end; ++n) scale[n] = kernels.quantize_row(src + n * K, K, max_level, dst + n * K);
  });
  return {q, scales};
}

struct PackedLinear::State {
  Precision precision;
  int64_t N = 0, K = 0;
  const void* source = nullptr;  // the float32 weight's data, for packs()
  torch::Tensor weight;  // (N, K) int8 or bf16: the copy weight_bytes counts (oneDNN's matmul keeps its own)
  torch::Tensor bias;    // (N) float32 or undefined
  // int8
  torch::Tensor scales;  // (N) float32
  torch::Tensor colsum;  // (N) int32: each channel's sum of q, for the activations' zero points
  torch::Tensor panels;  // vit's int8_linear: the weight packed (model/row_kernels.h)
#if VIT_WITH_DNNL
  std::unique_ptr<DnnlMatmul> matmul;  // oneDNN's int8 (int8_path().onednn) or bf16 product
#endif

  void forward_int8(const float* x, int64_t M, float* y, int64_t ld, const float* bias_or_null) const;
  void rows_int8(const float* x, int64_t M, float* y, int64_t ld, const float* bias_or_null) const;
};

PackedLinear::PackedLinear(const torch::Tensor& weight, const torch::Tensor& bias, Precision precision)
    : state_(std::make_unique<State>()) {
  TORCH_CHECK(weight.dim() == 2, "PackedLinear: weight must be (N, K), got ", weight.sizes());
  if (precision != Precision::int8 && precision != Precision::bf16) {
    throw std::invalid_argument(std::string("PackedLinear: precision ") + name_of(precision) + " is not int8 or bf16");
  }
  if (const auto refusal = precision_refusal(precision, torch::kCPU); !refusal.empty()) {
    throw std::invalid_argument(refusal);
  }
  auto& s = *state_;
  s.precision = precision;
  s.N = weight.size(0), s.K = weight.size(1);
  s.source = weight.data_ptr();
  if (bias.defined()) s.bias = bias.detach().to(torch::kCPU, torch::kFloat).contiguous();
  if (precision == Precision::bf16) {
    s.weight = weight.detach().to(torch::kCPU, torch::kBFloat16).contiguous();
#if VIT_WITH_DNNL
    s.matmul = std::make_unique<DnnlMatmul>(MatmulType::bf16, s.N, s.K, s.weight.data_ptr());
#endif
    return;
  }
  const auto& path = int8_path();
  std::tie(s.weight, s.scales) = quantize_weight_int8(weight, path.weight_max);
#if VIT_WITH_DNNL
  if (path.onednn) {  // oneDNN keeps the weight in its own layout
    s.matmul = std::make_unique<DnnlMatmul>(MatmulType::int8, s.N, s.K, s.weight.data_ptr());
    s.colsum = s.weight.sum(/*dim=*/1).to(torch::kInt);
    return;
  }
#endif
  s.colsum = torch::empty({s.N}, torch::kInt);
  s.panels = torch::empty({int8_panels(s.N) * int8_k4(s.K) * kInt8PanelWidth}, torch::kChar);
  pack_int8_weight(s.weight.data_ptr<int8_t>(), s.N, s.K, s.panels.data_ptr<int8_t>(), s.colsum.data_ptr<int32_t>());
}

PackedLinear::~PackedLinear() = default;

Precision PackedLinear::precision() const { return state_->precision; }

int64_t PackedLinear::weight_bytes() const {
  const auto& s = *state_;
  int64_t bytes = s.weight.numel() * static_cast<int64_t>(s.weight.element_size());
  for (const auto* extra : {&s.scales, &s.colsum, &s.bias}) {
    if (extra->defined()) bytes += extra->numel() * 4;
  }
  return bytes;
}

bool PackedLinear::packs(const torch::Tensor& weight) const {
  const auto& s = *state_;
  return weight.defined() && weight.data_ptr() == s.source && weight.dim() == 2 && weight.size(0) == s.N &&
         weight.size(1) == s.K;
}

torch::Tensor PackedLinear::forward(const torch::Tensor& x) const {
  const auto& s = *state_;
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat && x.size(-1) == s.K,
              "PackedLinear: input must be CPU float32 (..., ", s.K, "), got ", x.sizes(), " ", x.dtype());
  torch::NoGradGuard no_grad;
  auto out_shape = x.sizes().vec();
  out_shape.back() = s.N;
  const auto rows = x.reshape({-1, s.K}).contiguous();
  const int64_t M = rows.size(0);
  auto out = torch::empty({M, s.N}, torch::kFloat);
  if (M == 0) return out.view(out_shape);
  if (s.precision == Precision::int8) {
    s.forward_int8(rows.data_ptr<float>(), M, out.data_ptr<float>(), s.N,
                   s.bias.defined() ? s.bias.data_ptr<float>() : nullptr);
    return out.view(out_shape);
  }
#if VIT_WITH_DNNL
  const auto input = rows.to(torch::kBFloat16);
  s.matmul->run(M, input.data_ptr(), out.data_ptr(), s.bias.defined() ? s.bias.data_ptr<float>() : nullptr);
#endif
  return out.view(out_shape);
}

void PackedLinear::forward_rows(const float* in, int64_t M, float* out, int64_t ld, const float* bias) const {
  const auto& s = *state_;
  TORCH_CHECK(s.precision == Precision::int8, "PackedLinear::forward_rows: int8 layers only");
  if (M > 0) s.forward_int8(in, M, out, ld, bias);
}

// Rows of at most this many go through on the calling thread, inside a parallel region or not: a tile's worth of a
// thread's rows in the fused block.
constexpr int64_t kInt8ChunkRows = 128;

// M rows, each quantized with its own scale and zero point, the products exact in int32, then back to float32 with
// the weight's scales and the bias. Outside a parallel region chunks of rows go to the threads; inside one (the fused
// block's) the calling thread takes them all.
void PackedLinear::State::forward_int8(const float* x, int64_t M, float* y, int64_t ld, const float* bias_or_null) const {
  if (at::in_parallel_region() || M <= kInt8ChunkRows / 4) {
    for (int64_t r0 = 0; r0 < M; r0 += kInt8ChunkRows) {
      rows_int8(x + r0 * K, std::min(kInt8ChunkRows, M - r0), y + r0 * ld, ld, bias_or_null);
    }
    return;
  }
  // Chunks, each quantized and multiplied by one thread: a row's activations stay in that thread's cache. Where there
  // are fewer chunks than threads (batch 1's 197 rows, 2 threads), smaller ones.
  const int64_t threads = at::get_num_threads();
  const int64_t chunk = std::min(kInt8ChunkRows, std::max<int64_t>(4, (M + threads - 1) / threads));
  const int64_t chunks = (M + chunk - 1) / chunk;
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t r0 = c * chunk;
      rows_int8(x + r0 * K, std::min(chunk, M - r0), y + r0 * ld, ld, bias_or_null);
    }
  });
}

// M <= kInt8ChunkRows rows on the calling thread, through its own scratch.
void PackedLinear::State::rows_int8(const float* x, int64_t M, float* y, int64_t ld, const float* bias_or_null) const {
  const auto& kernels = row_kernels();
  // vit's int8_linear reads rows of K4 (the K4 - K padding zero), oneDNN's dense rows of K.
  const int64_t lda = panels.defined() ? int8_k4(K) : K;
  thread_local std::vector<uint8_t> q;
  thread_local std::vector<int32_t> zero_points;
  thread_local std::vector<float> row_scales;
  if (q.size() < static_cast<size_t>(M * lda)) q.resize(M * lda);
  if (zero_points.size() < static_cast<size_t>(M)) zero_points.resize(M), row_scales.resize(M);
  for (int64_t r = 0; r < M; ++r) {
    uint8_t* row = q.data() + r * lda;
    row_scales[r] = kernels.quantize_row_u8(x + r * K, K, row, &zero_points[r]);
    std::fill(row + K, row + lda, uint8_t{0});
  }
  Int8Weight w{panels.defined() ? panels.data_ptr<int8_t>() : nullptr, N, int8_k4(K), colsum.data_ptr<int32_t>(),
               scales.data_ptr<float>(), bias_or_null};
  if (panels.defined()) {
    const Int8Rows a{q.data(), lda, M, zero_points.data(), row_scales.data()};
    kernels.int8_linear(a, w, 0, int8_panels(N), y, ld);
    return;
  }
#if VIT_WITH_DNNL
  thread_local std::vector<int32_t> acc;
  if (acc.size() < static_cast<size_t>(M * N)) acc.resize(M * N);
  matmul->run(M, q.data(), acc.data(), nullptr, /*in_parallel_region=*/at::in_parallel_region());
  for (int64_t r = 0; r < M; ++r) {
    kernels.int8_dequantize_row(acc.data() + r * N, N, zero_points[r], w.colsum, row_scales[r], w.scale, w.bias,
                                y + r * ld);
  }
#endif
}

}  // namespace vit
