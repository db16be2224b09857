// CPU fast paths: linear layers and the attention core on oneDNN's row-major sgemm, with hand-written backward passes.
#include "model/cpu_kernels.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace vit {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// oneDNN's C API (dnnl.h): C = alpha op(A) op(B) + beta C, row-major, op = 'N' or 'T'; returns dnnl_success (0).
using SgemmFn = int (*)(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                        int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// BLAS's Fortran sgemm (column-major, arguments by pointer, 32-bit integers: the LP64 interface).
using FortranSgemmFn = void (*)(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                                const float* alpha, const float* A, const int* lda, const float* B, const int* ldb,
                                const float* beta, float* C, const int* ldc);
FortranSgemmFn fortran_sgemm = nullptr;

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the same buffers with the operands swapped.
int sgemm_through_fortran(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const int64_t limit = std::numeric_limits<int>::max();
  TORCH_CHECK(M <= limit && N <= limit && K <= limit && lda <= limit && ldb <= limit && ldc <= limit,
              "sgemm ", M, "x", N, "x", K, " exceeds the 32-bit BLAS interface");
  const int m = static_cast<int>(N), n = static_cast<int>(M), k = static_cast<int>(K);
  const int la = static_cast<int>(lda), lb = static_cast<int>(ldb), lc = static_cast<int>(ldc);
  fortran_sgemm(&transb, &transa, &m, &n, &k, &alpha, B, &lb, A, &la, &beta, C, &lc);
  return 0;
}

}  // namespace

bool mkl_blas_loaded() { return dlsym(RTLD_DEFAULT, "mkl_blas_sgemm") != nullptr; }

namespace {

// PyTorch's wheel hides its oneDNN but exports the sgemm_ of the MKL it links statically, the same kernel its matmul
// uses: taken first. Debian's libtorch exports oneDNN's dnnl_sgemm (AVX-512 where the CPU has it; its own matmul goes
// through OpenBLAS, which stops at AVX2). In the wheel's build Debian's libdnnl is loaded too (model/dnnl_matmul.h),
// and its dnnl_sgemm answers "unimplemented" (status 3) there, hence MKL first. Anything else: no fast path.
SgemmFn find_sgemm() {
  static const SgemmFn sgemm = []() -> SgemmFn {
    const char* choice = std::getenv("VIT_CPU_KERNELS");
    if (choice != nullptr && std::strcmp(choice, "aten") == 0) return nullptr;
    // sgemm_ only where it is MKL's: another BLAS's (OpenBLAS) would be no faster than ATen's own matmul.
    if (void* fortran = mkl_blas_loaded() ? dlsym(RTLD_DEFAULT, "sgemm_") : nullptr) {
      fortran_sgemm = reinterpret_cast<FortranSgemmFn>(fortran);
      return &sgemm_through_fortran;
    }
    if (void* found = dlsym(RTLD_DEFAULT, "dnnl_sgemm")) return reinterpret_cast<SgemmFn>(found);
    return nullptr;
  }();
  return sgemm;
}

bool fast_linear_applies(const torch::Tensor& x, const torch::Tensor& weight) {
  return cpu_kernels_available() && x.is_cpu() && weight.is_cpu() && x.scalar_type() == torch::kFloat32 &&
         weight.scalar_type() == torch::kFloat32 && x.dim() >= 1 && x.numel() > 0 && weight.dim() == 2 &&
         x.size(-1) == weight.size(1);
}

// y (M, out) = x (M, in) W^T + b, bias copied into y first and accumulated onto (beta 1), as ATen's addmm.
torch::Tensor linear_forward(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  const int64_t in = weight.size(1), out = weight.size(0), rows = x.numel() / in;
  auto sizes = x.sizes().vec();
  sizes.back() = out;
  // A fresh buffer: with one row, bias.expand(sizes) is already contiguous and contiguous() would hand back the
  // bias itself, which the sgemm (beta = 1) would then overwrite.
  auto y = bias.defined() ? bias.expand(sizes).clone(at::MemoryFormat::Contiguous) : torch::empty(sizes, x.options());
  sgemm('N', 'T', rows, out, in, 1.0f, x.data_ptr<float>(), in, weight.data_ptr<float>(), in,
        bias.defined() ? 1.0f : 0.0f, y.data_ptr<float>(), out);
  return y;
}

// bias: (out), or an empty (0) tensor for none (LibTorch 1.13's custom functions reject undefined inputs).
struct LinearFunction : torch::autograd::Function<LinearFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& bias) {
    ctx->save_for_backward({x, weight});
    return linear_forward(x, weight, bias.numel() > 0 ? bias : torch::Tensor());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& weight = saved[1];
    const auto grad = grads[0].contiguous();  // (..., out)
    const int64_t in = weight.size(1), out = weight.size(0), rows = grad.numel() / out;
    torch::Tensor grad_x, grad_weight, grad_bias;
    if (ctx->needs_input_grad(0)) {  // (M, in) = grad (M, out) W (out, in)
      grad_x = torch::empty(x.sizes(), x.options());
      sgemm('N', 'N', rows, in, out, 1.0f, grad.data_ptr<float>(), out, weight.data_ptr<float>(), in, 0.0f,
            grad_x.data_ptr<float>(), in);
    }
    if (ctx->needs_input_grad(1)) {  // (out, in) = grad^T (out, M) x (M, in)
      grad_weight = torch::empty({out, in}, weight.options());
      sgemm('T', 'N', out, in, rows, 1.0f, grad.data_ptr<float>(), out, x.data_ptr<float>(), in, 0.0f,
            grad_weight.data_ptr<float>(), in);
    }
    if (ctx->needs_input_grad(2)) grad_bias = grad.view({rows, out}).sum(0);  // only a real bias requires grad
    return {grad_x, grad_weight, grad_bias};
  }
};

// Pointers into one batch element's qkv (N, 3D) row block: q, k, v of head h start at h*hd, D + h*hd, 2D + h*hd,
// each an (N, hd) matrix with row stride 3D.
struct QkvLayout {
  int64_t B, N, D, heads, hd;
  int64_t row() const { return 3 * D; }
  int64_t q(int64_t b, int64_t h) const { return b * N * 3 * D + h * hd; }
  int64_t k(int64_t b, int64_t h) const { return q(b, h) + D; }
  int64_t v(int64_t b, int64_t h) const { return q(b, h) + 2 * D; }
  int64_t merged(int64_t b, int64_t h) const { return b * N * D + h * hd; }  // head h's columns of (B, N, D)
  int64_t square(int64_t b, int64_t h) const { return (b * heads + h) * N * N; }  // (B, nh, N, N) slice
};

QkvLayout layout_of(const torch::Tensor& qkv, int64_t heads) {
  const int64_t D = qkv.size(2) / 3;
  TORCH_CHECK(qkv.dim() == 3 && qkv.size(2) == 3 * D && D % heads == 0, "attention core: qkv ", qkv.sizes(),
              " is not (B, N, 3D) with D divisible by ", heads, " heads");
  return {qkv.size(0), qkv.size(1), D, heads, D / heads};
}

// Runs body(b, h) for every batch element and head, spread over the intra-op threads (each sgemm then runs on
// one thread: there is one small product per head, and many heads).
template <typename Body>
void for_each_head(const QkvLayout& l, const Body& body) {
  at::parallel_for(0, l.B * l.heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) body(i / l.heads, i % l.heads);
  });
}

// As for_each_head, with each head's query rows split into blocks when there are fewer heads than twice the
// threads (batch 1 inference: 3 heads on 2 threads would leave one thread idle a third of the time).
template <typename Body>
void for_each_head_rows(const QkvLayout& l, const Body& body) {
  const int64_t heads = l.B * l.heads;
  const int64_t blocks = std::clamp<int64_t>((2 * at::get_num_threads() + heads - 1) / heads, 1, l.N);
  const int64_t rows = (l.N + blocks - 1) / blocks;
  at::parallel_for(0, heads * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t head = i / blocks, first = (i % blocks) * rows;
      if (first < l.N) body(head / l.heads, head % l.heads, first, std::min(rows, l.N - first));
    }
  });
}

// -> out (B, N, D) and the softmax probabilities (B, nh, N, N) it used. Query rows are independent here.
std::pair<torch::Tensor, torch::Tensor> attention_forward(const torch::Tensor& qkv, int64_t heads, double scale) {
  const auto l = layout_of(qkv, heads);
  const float* base = qkv.data_ptr<float>();
  auto logits = torch::empty({l.B, heads, l.N, l.N}, qkv.options());  // (B, nh, N, N)
  float* s = logits.data_ptr<float>();
  for_each_head_rows(l, [&](int64_t b, int64_t h, int64_t first, int64_t count) {
    // scale q k^T, as timm's (q * scale) @ k^T up to rounding
    sgemm('N', 'T', count, l.N, l.hd, static_cast<float>(scale), base + l.q(b, h) + first * l.row(), l.row(),
          base + l.k(b, h), l.row(), 0.0f, s + l.square(b, h) + first * l.N, l.N);
  });
  auto probs = logits.softmax(-1);
  logits.reset();
  auto out = torch::empty({l.B, l.N, l.D}, qkv.options());  // (B, N, D)
  const float* p = probs.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for_each_head_rows(l, [&](int64_t b, int64_t h, int64_t first, int64_t count) {
    // probs @ v, straight into head h's columns
    sgemm('N', 'N', count, l.hd, l.N, 1.0f, p + l.square(b, h) + first * l.N, l.N, base + l.v(b, h), l.row(), 0.0f,
          o + l.merged(b, h) + first * l.D, l.D);
  });
  return {out, probs};
}

struct AttentionFunction : torch::autograd::Function<AttentionFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& qkv, int64_t heads, double scale) {
    auto [out, probs] = attention_forward(qkv, heads, scale);
    ctx->save_for_backward({qkv, probs});
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["scale"] = scale;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& qkv = saved[0];
    const auto& probs = saved[1];
    const auto scale = static_cast<float>(ctx->saved_data["scale"].toDouble());
    const auto l = layout_of(qkv, ctx->saved_data["heads"].toInt());
    const auto grad_out = grads[0].contiguous();  // (B, N, D)
    const float* base = qkv.data_ptr<float>();
    const float* p = probs.data_ptr<float>();
    const float* dout = grad_out.data_ptr<float>();
    auto grad_qkv = torch::empty_like(qkv);           // every element is written below
    auto grad_probs = torch::empty_like(probs);       // (B, nh, N, N)
    float* dqkv = grad_qkv.data_ptr<float>();
    float* dp = grad_probs.data_ptr<float>();
    for_each_head(l, [&](int64_t b, int64_t h) {
      // dv = probs^T dout; dprobs = dout v^T
      sgemm('T', 'N', l.N, l.hd, l.N, 1.0f, p + l.square(b, h), l.N, dout + l.merged(b, h), l.D, 0.0f,
            dqkv + l.v(b, h), l.row());
      sgemm('N', 'T', l.N, l.N, l.hd, 1.0f, dout + l.merged(b, h), l.D, base + l.v(b, h), l.row(), 0.0f,
            dp + l.square(b, h), l.N);
    });
    const auto grad_logits = at::_softmax_backward_data(grad_probs, probs, -1, torch::kFloat32);
    grad_probs.reset();
    const float* ds = grad_logits.data_ptr<float>();
    for_each_head(l, [&](int64_t b, int64_t h) {
      // dq = scale dlogits k; dk = scale dlogits^T q
      sgemm('N', 'N', l.N, l.hd, l.N, scale, ds + l.square(b, h), l.N, base + l.k(b, h), l.row(), 0.0f,
            dqkv + l.q(b, h), l.row());
      sgemm('T', 'N', l.N, l.hd, l.N, scale, ds + l.square(b, h), l.N, base + l.q(b, h), l.row(), 0.0f,
            dqkv + l.k(b, h), l.row());
    });
    return {grad_qkv, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool cpu_kernels_available() { return find_sgemm() != nullptr; }

const char* sgemm_library() {
  if (find_sgemm() == nullptr) return "none";
  return find_sgemm() == &sgemm_through_fortran ? "MKL" : "oneDNN";
}

void sgemm(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const int status = find_sgemm()(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  TORCH_CHECK(status == 0, "oneDNN sgemm failed (status ", status, ") for ", M, "x", N, "x", K);
}

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  if (!fast_linear_applies(x, weight) || (bias.defined() && bias.scalar_type() != torch::kFloat32)) {
    return torch::nn::functional::linear(x, weight, bias);
  }
  const auto x_contiguous = x.contiguous();
  const auto weight_contiguous = weight.contiguous();
  const bool grad = torch::GradMode::is_enabled() &&
                    (x.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad()));
  if (!grad) return linear_forward(x_contiguous, weight_contiguous, bias);
  return LinearFunction::apply(x_contiguous, weight_contiguous, bias.defined() ? bias : torch::empty({0}, x.options()));
}

bool attention_core_applies(const torch::Tensor& qkv) {
  return cpu_kernels_available() && qkv.is_cpu() && qkv.scalar_type() == torch::kFloat32 && qkv.dim() == 3 &&
         qkv.size(2) % 3 == 0 && qkv.numel() > 0;
}

torch::Tensor attention_core(const torch::Tensor& qkv, int64_t num_heads, double scale) {
  TORCH_CHECK(attention_core_applies(qkv), "attention core: needs CPU float32 (B, N, 3D) and oneDNN, got ",
              qkv.sizes(), " ", qkv.scalar_type(), " on ", qkv.device());
  const auto contiguous = qkv.contiguous();
  if (!torch::GradMode::is_enabled() || !qkv.requires_grad()) return attention_forward(contiguous, num_heads, scale).first;
  return AttentionFunction::apply(contiguous, num_heads, scale);
}

}  // namespace vit
