// model/dnnl_matmul.h over oneDNN 2's C++ API (Debian's libdnnl-dev).
#include "model/dnnl_matmul.h"

#include <dnnl.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace vit {
namespace {

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

// The brgemm kernels (AMX, AVX512_BF16, AVX-512) where oneDNN has one for the shape, even where it would rank its
// gemm-based one first (small shapes): in a process that also holds PyTorch's wheel, whose LibTorch exports its own
// oneDNN's weak gemm_info_t symbols, the gemm-based kernels of Debian's oneDNN bind to those and fail to run. The first
// choice where there is none.
void prefer_brgemm(dnnl::matmul::primitive_desc& pd) {
  const dnnl::matmul::primitive_desc first = pd;
  while (std::string(pd.impl_info_str()).rfind("brg", 0) != 0) {
    if (!pd.next_impl()) {
      pd = first;
      return;
    }
  }
}

}  // namespace

struct DnnlMatmul::State {
  MatmulType type;
  int64_t N, K;
  std::vector<char> weight;  // (N, K) row-major: the (K, N) matrix oneDNN reads in layout "ba" (int8, bf16)
  const void* weight_in_place = nullptr;  // f32's

  struct Entry {
    dnnl::matmul matmul;
    dnnl::memory::desc scratchpad;
    dnnl::memory weights;  // the weight in the layout this primitive reads
    std::string kernel;    // oneDNN's name for the implementation chosen
  };
  mutable std::mutex mutex;
  using Key = std::tuple<int64_t, bool, bool, int, float>;  // M, with bias, inside a parallel region, epilogue
  mutable std::map<Key, Entry> primitives;
  mutable std::vector<std::pair<dnnl::memory::desc, dnnl::memory>> packed;  // the weight in each layout wanted

  dt input_type() const { return type == MatmulType::int8 ? dt::u8 : type == MatmulType::bf16 ? dt::bf16 : dt::f32; }
  dt weight_type() const { return type == MatmulType::int8 ? dt::s8 : input_type(); }
  dt output_type() const { return type == MatmulType::int8 ? dt::s32 : dt::f32; }
  const void* weight_data() const { return type == MatmulType::f32 ? weight_in_place : weight.data(); }

  // The primitive for M rows (made on first use); a copy of its handles, so callers need no lock.
  Entry entry(int64_t M, bool with_bias, bool in_parallel_region, Epilogue epilogue) const {
    std::lock_guard<std::mutex> lock(mutex);
    const Key key{M, with_bias, in_parallel_region, epilogue.kind, epilogue.alpha};
    auto found = primitives.find(key);
    if (found != primitives.end()) return found->second;
    const dnnl::memory::desc src({M, K}, input_type(), tag::ab);
    const dnnl::memory::desc weights({K, N}, weight_type(), tag::any);
    const dnnl::memory::desc dst({M, N}, output_type(), tag::ab);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (epilogue.kind != Epilogue::none) {
      if (type == MatmulType::int8) throw std::invalid_argument("DnnlMatmul: an epilogue on an int8 product");
      const auto algorithm = epilogue.kind == Epilogue::gelu_erf    ? dnnl::algorithm::eltwise_gelu_erf
                             : epilogue.kind == Epilogue::gelu_tanh ? dnnl::algorithm::eltwise_gelu_tanh
                                                                    : dnnl::algorithm::eltwise_swish;
      dnnl::post_ops ops;
      ops.append_eltwise(1.0f, algorithm, epilogue.alpha, 0.0f);
      attr.set_post_ops(ops);
    }
    const auto desc = with_bias
                          ? dnnl::matmul::desc(src, weights, dnnl::memory::desc({1, N}, dt::f32, tag::ab), dst)
                          : dnnl::matmul::desc(src, weights, dst);
    dnnl::matmul::primitive_desc pd(desc, attr, cpu_engine());
    if (type == MatmulType::f32) prefer_brgemm(pd);
    const auto wanted = pd.weights_desc();
    size_t index = 0;
    while (index < packed.size() && packed[index].first != wanted) ++index;
    if (index == packed.size()) {
      dnnl::memory plain({{K, N}, weight_type(), tag::ba}, cpu_engine(), const_cast<void*>(weight_data()));
      dnnl::memory reordered(wanted, cpu_engine());
      dnnl::stream stream(cpu_engine());
      dnnl::reorder(plain, reordered).execute(stream, plain, reordered);
      stream.wait();
      packed.emplace_back(wanted, reordered);
    }
    Entry made{dnnl::matmul(pd), pd.scratchpad_desc(), packed[index].second, pd.impl_info_str()};
    return primitives.emplace(key, std::move(made)).first->second;
  }
};

DnnlMatmul::DnnlMatmul(MatmulType type, int64_t N, int64_t K, const void* weight) : state_(std::make_unique<State>()) {
  auto& s = *state_;
  s.type = type, s.N = N, s.K = K;
  if (type == MatmulType::f32) {
    s.weight_in_place = weight;
    return;
  }
  const size_t bytes = static_cast<size_t>(N * K) * (type == MatmulType::int8 ? 1 : 2);
  s.weight.resize(bytes);
  std::memcpy(s.weight.data(), weight, bytes);
}

DnnlMatmul::~DnnlMatmul() = default;

void DnnlMatmul::run(int64_t M, const void* a, void* c, const float* bias, bool in_parallel_region,
                     Epilogue epilogue) const {
  const auto& s = *state_;
  const bool with_bias = bias != nullptr && s.type != MatmulType::int8;
  const auto entry = s.entry(M, with_bias, in_parallel_region, epilogue);
  thread_local std::vector<char> scratch;
  if (scratch.size() < entry.scratchpad.get_size()) scratch.resize(entry.scratchpad.get_size());
  auto& engine = cpu_engine();
  dnnl::stream stream(engine);
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, dnnl::memory({{M, s.K}, s.input_type(), tag::ab}, engine, const_cast<void*>(a))},
      {DNNL_ARG_WEIGHTS, entry.weights},
      {DNNL_ARG_DST, dnnl::memory({{M, s.N}, s.output_type(), tag::ab}, engine, c)},
      {DNNL_ARG_SCRATCHPAD, dnnl::memory(entry.scratchpad, engine, scratch.data())}};
  if (with_bias) {
    args.emplace(DNNL_ARG_BIAS, dnnl::memory({{1, s.N}, dt::f32, tag::ab}, engine, const_cast<float*>(bias)));
  }
  entry.matmul.execute(stream, args);
  stream.wait();
}

bool DnnlMatmul::f32_packing_available() {
  static const bool available = [] {
    constexpr int64_t n = 64;
    const dnnl::memory::desc src({n, n}, dt::f32, tag::ab), weights({n, n}, dt::f32, tag::any);
    const dnnl::memory::desc bias({1, n}, dt::f32, tag::ab), dst({n, n}, dt::f32, tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, weights, bias, dst), cpu_engine());
    prefer_brgemm(pd);
    return std::string(pd.impl_info_str()).rfind("brg", 0) == 0;
  }();
  return available;
}

std::string dnnl_version_text() {
  const auto* version = dnnl::version();
  return std::to_string(version->major) + "." + std::to_string(version->minor) + "." + std::to_string(version->patch);
}

const char* dnnl_cpu_isa() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_mic: return "avx512_mic";
    case dnnl::cpu_isa::avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "unknown";
  }
}

bool dnnl_has_bf16() {
  const auto isa = dnnl::get_effective_cpu_isa();
  return isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
}

bool dnnl_has_amx() { return dnnl::get_effective_cpu_isa() == dnnl::cpu_isa::avx512_core_amx; }

std::string DnnlMatmul::kernel(int64_t M) const { return state_->entry(M, false, false, {}).kernel; }

bool int8_products_exact() {
  static const bool exact = [] {
    constexpr int64_t M = 8, K = 64, N = 32;
    const std::vector<uint8_t> a(M * K, 255);
    const std::vector<int8_t> w(N * K, 127);
    std::vector<int32_t> c(M * N);
    try {
      const DnnlMatmul matmul(MatmulType::int8, N, K, w.data());
      if (matmul.kernel(M).rfind("brg", 0) != 0) return false;
      matmul.run(M, a.data(), c.data(), nullptr);
    } catch (const dnnl::error&) {  // no int8 matmul at all at this instruction set
      return false;
    }
    return std::all_of(c.begin(), c.end(), [](int32_t value) { return value == 255 * 127 * K; });
  }();
  return exact;
}

namespace {

// A product's shape, strides, scalars and input type (bf16 or f32): what its primitive is made for.
using GemmKey = std::tuple<char, char, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, float, bool, dt>;

struct Gemm {
  dnnl::matmul matmul;
  dnnl::memory::desc a, b, c, bias, scratchpad;
  std::string kernel;  // oneDNN's name for the implementation chosen
};

Gemm make_gemm(const GemmKey& key) {
  const auto [transa, transb, M, N, K, lda, ldb, ldc, alpha, beta, with_bias, type] = key;
  using dims = dnnl::memory::dims;
  // op(A) (M, K) and op(B) (K, N) as strided views of the row-major arrays: a transpose swaps the strides.
  const dnnl::memory::desc a({M, K}, type, transa == 'N' ? dims{lda, 1} : dims{1, lda});
  const dnnl::memory::desc b({K, N}, type, transb == 'N' ? dims{ldb, 1} : dims{1, ldb});
  const dnnl::memory::desc c({M, N}, dt::f32, dims{ldc, 1});
  const dnnl::memory::desc bias = with_bias ? dnnl::memory::desc({1, N}, dt::f32, tag::ab) : dnnl::memory::desc();
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops sum;
    sum.append_sum(beta);
    attr.set_post_ops(sum);
  }
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, bias, c), attr, cpu_engine());
  prefer_brgemm(pd);
  return {dnnl::matmul(pd), a, b, c, bias, pd.scratchpad_desc(), pd.impl_info_str()};
}

// Runs C = alpha op(A) op(B) (+ bias) + beta C on dense operands of the key's type through the running thread's
// primitive for the key. False, running nothing, for a float32 product oneDNN has no brgemm kernel for (bfloat16's
// run on the kernel chosen).
bool run_gemm(const GemmKey& key, const void* A, const void* B, float* C, const float* bias) {
  // Each thread keeps the primitives it made (once per shape; no lock on the hot path). oneDNN fixes a primitive's
  // split over threads when it is made, so a primitive made inside a parallel region is also run inside one.
  thread_local std::map<GemmKey, Gemm> made;
  auto found = made.find(key);
  if (found == made.end()) found = made.emplace(key, make_gemm(key)).first;
  const Gemm& gemm = found->second;
  if (std::get<11>(key) == dt::f32 && gemm.kernel.rfind("brg", 0) != 0) return false;
  thread_local std::vector<char> scratch;
  if (scratch.size() < gemm.scratchpad.get_size()) scratch.resize(gemm.scratchpad.get_size());
  auto& engine = cpu_engine();
  dnnl::stream stream(engine);
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, dnnl::memory(gemm.a, engine, const_cast<void*>(A))},
      {DNNL_ARG_WEIGHTS, dnnl::memory(gemm.b, engine, const_cast<void*>(B))},
      {DNNL_ARG_DST, dnnl::memory(gemm.c, engine, C)},
      {DNNL_ARG_SCRATCHPAD, dnnl::memory(gemm.scratchpad, engine, scratch.data())}};
  if (bias != nullptr) args.emplace(DNNL_ARG_BIAS, dnnl::memory(gemm.bias, engine, const_cast<float*>(bias)));
  try {
    gemm.matmul.execute(stream, args);
    stream.wait();
  } catch (const dnnl::error& e) {
    const auto [transa, transb, M, N, K, lda, ldb, ldc, alpha, beta, with_bias, type] = key;
    throw std::runtime_error(std::string(type == dt::bf16 ? "gemm_bf16 " : "gemm_f32 ") + std::to_string(M) + "x" +
                             std::to_string(N) + "x" + std::to_string(K) + " (oneDNN " + gemm.kernel +
                             "): " + e.what());
  }
  return true;
}

}  // namespace

void gemm_bf16(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda,
               const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc, const float* bias) {
  if (M == 0 || N == 0) return;
  if (bias != nullptr && alpha != 1.0f) throw std::invalid_argument("gemm_bf16: a bias with alpha other than 1");
  // oneDNN's brgemm kernels read A and B and write C dense (leading dimension = row length): a strided operand goes
  // through a dense copy of it, the running thread's own.
  const int64_t a_cols = transa == 'N' ? K : M, b_cols = transb == 'N' ? N : K;
  if (lda != a_cols || ldb != b_cols) {
    thread_local std::vector<uint16_t> dense_a, dense_b;
    auto dense = [](const uint16_t* from, int64_t rows, int64_t cols, int64_t ld, std::vector<uint16_t>& to) {
      if (to.size() < static_cast<size_t>(rows * cols)) to.resize(rows * cols);
      for (int64_t i = 0; i < rows; ++i) std::memcpy(to.data() + i * cols, from + i * ld, cols * sizeof(uint16_t));
      return to.data();
    };
    if (lda != a_cols) A = dense(A, transa == 'N' ? M : K, a_cols, lda, dense_a), lda = a_cols;
    if (ldb != b_cols) B = dense(B, transb == 'N' ? K : N, b_cols, ldb, dense_b), ldb = b_cols;
  }
  if (ldc != N) {  // through a dense copy, then C = copy + beta C
    thread_local std::vector<float> dense;
    if (dense.size() < static_cast<size_t>(M * N)) dense.resize(M * N);
    gemm_bf16(transa, transb, M, N, K, alpha, A, lda, B, ldb, 0.0f, dense.data(), N, bias);
    for (int64_t i = 0; i < M; ++i) {
      float* row = C + i * ldc;
      const float* from = dense.data() + i * N;
      for (int64_t j = 0; j < N; ++j) row[j] = from[j] + (beta == 0.0f ? 0.0f : beta * row[j]);
    }
    return;
  }
  run_gemm({transa, transb, M, N, K, lda, ldb, ldc, alpha, beta, bias != nullptr, dt::bf16}, A, B, C, bias);
}

bool gemm_f32(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc, const float* bias) {
  if (M == 0 || N == 0) return true;
  if (bias != nullptr && alpha != 1.0f) throw std::invalid_argument("gemm_f32: a bias with alpha other than 1");
  const int64_t a_cols = transa == 'N' ? K : M, b_cols = transb == 'N' ? N : K;
  if (lda != a_cols || ldb != b_cols || ldc != N) {
    throw std::invalid_argument("gemm_f32: strided operands (dense rows only)");
  }
  return run_gemm({transa, transb, M, N, K, lda, ldb, ldc, alpha, beta, bias != nullptr, dt::f32}, A, B, C, bias);
}

}  // namespace vit
