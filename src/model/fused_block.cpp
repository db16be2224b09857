// The fused CPU block (model/fused_block.h): row kernels, the forward's parallel regions (three, or one), the
// backward's.
#include "model/fused_block.h"

#include <ATen/Config.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "model/cpu_kernels.h"
#include "model/fused_products.h"
#include "model/row_kernels.h"

namespace vit {
namespace {

using fused::data_or_null;
using fused::Products;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ---- activations: LibTorch's own vectorized kernels on a tile (one call per tile of rows, single-threaded inside
// a region) ----

torch::Tensor flat(const float* data, int64_t count) {
  return torch::from_blob(const_cast<float*>(data), {count}, torch::TensorOptions().dtype(torch::kFloat32));
}

// rows x cols floats with row stride ld.
torch::Tensor rows_view(const float* data, int64_t rows, int64_t cols, int64_t ld) {
  return torch::from_blob(const_cast<float*>(data), {rows, cols}, {ld, 1},
                          torch::TensorOptions().dtype(torch::kFloat32));
}

// out = act(in); out may be in (in place).
void activation_forward(const torch::Tensor& in, torch::Tensor out, Activation act) {
  switch (act) {
    case Activation::gelu:
      at::gelu_out(out, in, "none");
      return;
    case Activation::gelu_tanh:
      at::gelu_out(out, in, "tanh");
      return;
    case Activation::quick_gelu:
      at::mul_out(out, in, torch::sigmoid(in * 1.702));  // x sigmoid(1.702 x), as timm's QuickGELU
      return;
    case Activation::silu:
      at::silu_out(out, in);
      return;
  }
  throw std::logic_error("fused block: activation " + std::to_string(static_cast<int>(act)) + " is unknown");
}

// grad = grad act'(in), in place.
void activation_backward(const torch::Tensor& in, torch::Tensor grad, Activation act) {
  switch (act) {
    case Activation::gelu:
      at::gelu_backward_out(grad, grad, in, "none");
      return;
    case Activation::gelu_tanh:
      at::gelu_backward_out(grad, grad, in, "tanh");
      return;
    case Activation::quick_gelu: {
      const auto s = torch::sigmoid(in * 1.702);
      grad.mul_(s + in * 1.702 * s * (1.0 - s));
      return;
    }
    case Activation::silu:
      at::silu_backward_out(grad, grad, in);
      return;
  }
  throw std::logic_error("fused block: activation " + std::to_string(static_cast<int>(act)) + " is unknown");
}

// The MLP's hidden activations g (rows, hidden) from fc1's output h: act(h), in place when g is h; gated, h holds
// each row's gates then its values (row stride 2 hidden) and g = act(gates) values.
void mlp_activation(const float* h, float* g, int64_t rows, int64_t hidden, bool gated, Activation act) {
  if (!gated) {
    activation_forward(flat(h, rows * hidden), flat(g, rows * hidden), act);
    return;
  }
  auto out = rows_view(g, rows, hidden, hidden);
  activation_forward(rows_view(h, rows, hidden, 2 * hidden), out, act);
  out.mul_(rows_view(h + hidden, rows, hidden, 2 * hidden));
}

// mlp_activation's backward: dg (rows, hidden) -> dh, fc1's output gradient. Plain: in place (dh is dg). Gated: dh
// (row stride 2 hidden) gets d gates = dg values act'(gates), d values = dg act(gates).
void mlp_activation_backward(const float* h, float* dg, float* dh, int64_t rows, int64_t hidden, bool gated,
                             Activation act) {
  if (!gated) {
    activation_backward(flat(h, rows * hidden), flat(dg, rows * hidden), act);
    return;
  }
  const auto gates = rows_view(h, rows, hidden, 2 * hidden), values = rows_view(h + hidden, rows, hidden, 2 * hidden);
  const auto upstream = rows_view(dg, rows, hidden, hidden);
  auto dgates = rows_view(dh, rows, hidden, 2 * hidden), dvalues = rows_view(dh + hidden, rows, hidden, 2 * hidden);
  activation_forward(gates, dvalues, act);
  dvalues.mul_(upstream);
  at::mul_out(dgates, upstream, values);
  activation_backward(gates, dgates, act);
}

// Whether training's forward takes the MLP's activation with its derivative (RowKernels::gelu_with_derivative) and
// keeps the derivative where it would keep fc1's output: a plain MLP with the erf GELU, the default. The backward is
// then one multiply. LibTorch's gelu and gelu_backward (oneDNN's eltwise kernel and ATen's) each evaluated the erf
// again: 7% of the Fashion-MNIST default's training step.
bool gelu_with_derivative_applies(bool training, bool gated, Activation act) {
  return training && !gated && act == Activation::gelu;
}

// ---- the passes ----

// A thread's scratch buffer `slot`, grown to the largest size asked and kept: OpenMP's threads live as long as the
// process, so a shape's workspace is allocated once.
float* scratch(int slot, int64_t floats) {
  thread_local std::vector<float> buffers[4];
  auto& buffer = buffers[slot];
  if (static_cast<int64_t>(buffer.size()) < floats) buffer.resize(floats);
  return buffer.data();
}

// body(begin, end) over row ranges, one contiguous range per thread.
template <typename Body>
void for_rows(int64_t rows, const Body& body) {
  at::parallel_for(0, rows, /*grain_size=*/8, body);
}

constexpr int64_t kMaxRotaryHeadDim = 512;

// fc1 the width of fc1's output per row: hidden, or 2 hidden when gated (gates, then values).
struct Dims {
  int64_t B, N, D, R, heads, hd, hidden, fc1;
  bool gated;
};

Dims dims_of(const torch::Tensor& x, const BlockParameters& p, int64_t heads) {
  const int64_t B = x.size(0), N = x.size(1), D = x.size(2), hidden = p.fc2_weight.size(1);
  const bool gated = p.fc1v_weight.numel() > 0;
  TORCH_CHECK(D % heads == 0 && p.qkv_weight.size(0) == 3 * D && p.qkv_weight.size(1) == D &&
                  p.proj_weight.size(0) == D && p.fc1_weight.size(0) == hidden && p.fc1_weight.size(1) == D &&
                  p.fc2_weight.size(0) == D && (!gated || p.fc1v_weight.sizes() == p.fc1_weight.sizes()),
              "fused block: input ", x.sizes(), " does not fit qkv ", p.qkv_weight.sizes(), ", fc1 ",
              p.fc1_weight.sizes(), ", fc1v ", p.fc1v_weight.sizes(), ", fc2 ", p.fc2_weight.sizes(), " with ", heads,
              " heads");
  return {B, N, D, B * N, heads, D / heads, hidden, gated ? 2 * hidden : hidden, gated};
}

float keep_at(const float* keep, int64_t row, int64_t N) { return keep != nullptr ? keep[row / N] : 1.0f; }

// How a pass spreads its rows over the threads.
//  - narrow: one parallel region runs every step on each thread's own rows, the products as single-threaded sgemm
//    calls: no barrier between steps. Each thread reads every weight, which costs nothing when the weights are
//    small (the Fashion-MNIST default: 0.5 MB per block) or each thread has many rows to reuse them on. In
//    inference with small weights the rows go in tiles of kTileRows, so that the MLP's hidden rows stay in cache.
//  - wide: step by step, each product on all rows at once as one multi-threaded sgemm (which splits the weight's
//    columns between the threads: read once in all), the element-wise steps row-parallel between them. Batch-1
//    inference of ViT-B (28 MB of weights per block, 99 rows per thread) needs this.
constexpr int64_t kTileRows = 64;
constexpr int64_t kSmallWeightBytes = 1 << 20;
constexpr int64_t kReuseRows = 256;  // rows per thread from which a thread's own copy of the weights pays off

// Float32 inference's products run on packed weights (PackedProducts) in a wide plan, and in a narrow one up to this
// much weight per block. Measured (2 threads, oneDNN's brgemm against its sgemm, bias included): ViT-B/16's products
// on one thread and 788 rows, as a narrow plan runs them, 0.90-1.04x; ViT-Ti/16's (1.8 MB a block) 1.07-1.13x.
constexpr int64_t kPackedNarrowBytes = 4 << 20;

struct Plan {
  bool wide = false;
  int64_t tile = 0;         // narrow: rows per tile (0: the thread's whole range)
  bool packed = false;      // float32 inference's products on packed weights, where a block keeps them
  bool one_region = false;  // narrow inference in one region, a barrier before the attention (one_region_applies)
};

// Whether an inference pass whose images do not split evenly over the threads (batch 1) runs as one parallel region:
// each thread takes its own rows through norm1 and qkv, waits for the others' keys and values, then runs its rows'
// queries through the attention and on to the block's end. One barrier a block where a wide plan has one per step
// (nine). Each thread reads every weight, so only up to kPackedNarrowBytes of them; VIT_ONE_REGION=0 turns it off.
// The barrier needs every lane's thread running at once, which OpenMP's teams guarantee; other backends keep the
// plans below.
bool one_region_applies(const Dims& d, bool training, int64_t threads, int64_t weight_bytes) {
#if AT_PARALLEL_OPENMP
  static const bool enabled = [] {
    const char* value = std::getenv("VIT_ONE_REGION");
    return value == nullptr || std::string(value) != "0";
  }();
  return enabled && !training && threads > 1 && d.B % threads != 0 && weight_bytes <= kPackedNarrowBytes &&
         !at::in_parallel_region();
#else
  return false;
#endif
}

// weight_size: bytes per weight, 4 in float32, 1 in int8 (where a thread's copy of a block's weights is a quarter).
Plan plan_for(const Dims& d, bool training, int64_t weight_size = 4) {
  const int64_t threads = at::get_num_threads();
  const int64_t weight_bytes = weight_size * (4 * d.D * d.D + d.D * (d.fc1 + d.hidden));
  const bool small = weight_bytes <= kSmallWeightBytes;
  Plan plan;
  plan.one_region = one_region_applies(d, training, threads, weight_bytes);
  plan.wide = !plan.one_region && threads > 1 && !small && (d.R + threads - 1) / threads < kReuseRows;
  plan.tile = !plan.wide && !training && small ? kTileRows : 0;
  plan.packed = !training && (plan.wide || weight_bytes <= kPackedNarrowBytes);
  return plan;
}

// One step of a pass over rows [r0, r1). whole: in a wide plan it runs once on all rows from the calling thread,
// where sgemm (or LibTorch's kernel) spreads the work itself; otherwise it runs row-parallel.
struct Step {
  bool whole;
  std::function<void(int64_t r0, int64_t r1)> run;
};

// A narrow plan's steps over rows [r0, r1) on the calling thread, tile by tile.
void run_range(const Plan& plan, const std::vector<Step>& steps, int64_t r0, int64_t r1) {
  const int64_t tile = plan.tile > 0 ? plan.tile : r1 - r0;
  for (int64_t t0 = r0; t0 < r1; t0 += tile) {
    for (const auto& step : steps) step.run(t0, std::min(r1, t0 + tile));
  }
}

void run_steps(int64_t R, const Plan& plan, const std::vector<Step>& steps) {
  if (plan.wide) {
    for (const auto& step : steps) step.whole ? step.run(0, R) : for_rows(R, step.run);
    return;
  }
  for_rows(R, [&](int64_t r0, int64_t r1) { run_range(plan, steps, r0, r1); });
}

// Whether a pass runs as one parallel region, each thread taking its own images through the row steps before the
// attention, their attention and the row steps after it, with no barrier between: narrow plans whose images split
// evenly over the threads. for_rows gives each thread the same rows then, so the arithmetic is the same as three
// regions'. (An uneven split would leave a thread idle for up to an image's whole block; batch-1 inference needs the
// attention's query rows split between the threads.)
bool by_images(const Dims& d, const Plan& plan) {
  const int64_t threads = at::get_num_threads();
  return !plan.wide && threads > 1 && d.B % threads == 0;
}

// body(r0, r1, b0, b1) once per thread, over its images [b0, b1) and their rows [r0, r1).
template <typename Body>
void for_images(const Dims& d, const Body& body) {
  at::parallel_for(0, d.B, /*grain_size=*/1, [&](int64_t b0, int64_t b1) { body(b0 * d.N, b1 * d.N, b0, b1); });
}

// One parallel region in two phases: before(lane) for every lane in [0, lanes), then after(lane) once every lane's
// before has returned. Lanes are spread over the team as at::parallel_for spreads them (one each when lanes is the
// team's size); the barrier counts lanes, so a thread holding several runs all of their befores first. OpenMP runs a
// team's threads at once, which the barrier needs (one_region_applies). An exception in a before still arrives at
// the barrier, so the others are not left waiting, and is rethrown once the region is over.
template <typename Before, typename After>
void two_phases(int64_t lanes, const Before& before, const After& after) {
  std::atomic<int64_t> arrived{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  at::parallel_for(0, lanes, /*grain_size=*/1, [&](int64_t l0, int64_t l1) {
    try {
      for (int64_t lane = l0; lane < l1; ++lane) before(lane);
    } catch (...) {
      if (!failed.exchange(true)) error = std::current_exception();
    }
    arrived.fetch_add(l1 - l0, std::memory_order_acq_rel);
    for (int64_t spins = 1; arrived.load(std::memory_order_acquire) < lanes; ++spins) {
      if (spins % 1024 == 0) std::this_thread::yield();
    }
    if (failed.load()) return;
    for (int64_t lane = l0; lane < l1; ++lane) after(lane);
  });
  if (error) std::rethrow_exception(error);
}

// An intermediate of `width` floats per row that only steps of the same row range read: a whole (R, width)
// tensor in a wide plan, else the running thread's scratch `slot` holding the current range (row r at r - r0).
// Allocated only where `needed`.
struct Temporary {
  Temporary(const Plan& plan, int slot, int64_t R, int64_t width, const torch::TensorOptions& options,
            bool needed = true)
      : slot(plan.wide ? -1 : slot), width(width) {
    if (plan.wide && needed) whole = torch::empty({R, width}, options);
  }
  // The rows of [r0, r1), starting at row r0.
  float* rows(int64_t r0, int64_t r1) const {
    return slot < 0 ? whole.data_ptr<float>() + r0 * width : scratch(slot, (r1 - r0) * width);
  }
  int slot;
  int64_t width;
  torch::Tensor whole;
};

// What the backward reads, kept by a training forward. m (the MLP's output) only with LayerScale; the products' inputs
// rounded to bfloat16 (xn1_16 .. g16) only where they run in it. h: fc1's output, or where gelu_with_derivative_applies
// the activation's derivative there.
struct Saved {
  torch::Tensor xn1, mean1, rstd1, qkv, probs, att, a, y, mean2, rstd2, xn2, h, g, m, xn1_16, att16, xn2_16, g16;
};

// The attention of image b's head h for its query rows [first, first + count), on the calling thread.
void attention_query_rows(const Dims& d, const RowKernels& k, float scale, const torch::Tensor& qkv,
                          const torch::Tensor& probs, const torch::Tensor& att, int64_t b, int64_t h, int64_t first,
                          int64_t count) {
  const int64_t row = 3 * d.D, pair = b * d.heads + h;
  const float* q = qkv.data_ptr<float>() + b * d.N * row + h * d.hd;  // (N, hd), row stride 3D; k at +D, v at +2D
  float* s =
      probs.defined() ? probs.data_ptr<float>() + (pair * d.N + first) * d.N : scratch(0, count * d.N);  // (count, N)
  float* o = att.data_ptr<float>() + (b * d.N + first) * d.D + h * d.hd;
  if (short_attention_applies(d.N, d.hd)) {
    k.short_attention(q + first * row, q + d.D, q + 2 * d.D, row, d.N, d.hd, scale, count, s, o, d.D,
                      scratch(1, d.hd * 64));
    return;
  }
  sgemm('N', 'T', count, d.N, d.hd, scale, q + first * row, row, q + d.D, row, 0.0f, s, d.N);
  k.softmax_rows(s, count, d.N);
  sgemm('N', 'N', count, d.hd, d.N, 1.0f, s, d.N, q + 2 * d.D, row, 0.0f, o, d.D);
}

// The forward's region 2 on the calling thread, for items [item0, item1) of `blocks` per (image, head) pair (item i:
// query-row block i % blocks of pair i / blocks): softmax((scale q) k^T) v into the head's columns of att (R, D). probs
// (B, nh, N, N) receives the probabilities where defined (training).
void attention_forward_items(const Dims& d, const RowKernels& k, float scale, const torch::Tensor& qkv,
                             const torch::Tensor& probs, const torch::Tensor& att, int64_t blocks, int64_t item0,
                             int64_t item1) {
  const int64_t block_rows = (d.N + blocks - 1) / blocks;
  for (int64_t i = item0; i < item1; ++i) {
    const int64_t pair = i / blocks, first = (i % blocks) * block_rows;
    if (first >= d.N) continue;
    attention_query_rows(d, k, scale, qkv, probs, att, pair / d.heads, pair % d.heads, first,
                         std::min(block_rows, d.N - first));
  }
}

// The forward's region 2 on all pairs, each split into query-row blocks when there are fewer pairs than twice the
// threads (batch-1 inference).
void attention_forward(const Dims& d, const RowKernels& k, float scale, const torch::Tensor& qkv,
                       const torch::Tensor& probs, const torch::Tensor& att) {
  const int64_t pairs = d.B * d.heads;
  const int64_t blocks =
      probs.defined() ? 1 : std::clamp<int64_t>((2 * at::get_num_threads() + pairs - 1) / pairs, 1, d.N);
  at::parallel_for(0, pairs * blocks, 1, [&](int64_t begin, int64_t end) {
    attention_forward_items(d, k, scale, qkv, probs, att, blocks, begin, end);
  });
}

// fc1 on rows [r0, r1): its output (.., d.fc1), gated: the gates' products then the values'.
// in16 and act (a plain MLP's) as Products::linear_rows'.
void fc1_rows(const Dims& d, const BlockParameters& p, const Products& products, int64_t r0, int64_t r1,
              const float* in, float* out, uint16_t* in16, const Activation* act = nullptr) {
  products.linear_rows(r0, r1, in, p.fc1_weight, p.fc1_bias, out, d.fc1, in16, act);
  if (d.gated) products.linear_rows(r0, r1, in, p.fc1v_weight, p.fc1v_bias, out + d.hidden, d.fc1, in16);
}

// ---- rotary embeddings ----

// Rotates one head's hd channels in place by angles whose sines and cosines are sin, cos (hd each): x cos + rot(x)
// sin, rot pairing channel i with i + hd/2 (rotate_half: rot(x) = [-x2, x1]) or 2i with 2i + 1 ([-x1, x0, ...]), as
// apply_rope (model/rope.h). transpose: the backward, dx = dy cos - rot(dy sin) (rot is antisymmetric).
void rotate_head(float* x, int64_t hd, const float* sin, const float* cos, bool rotate_half, bool transpose) {
  float u[kMaxRotaryHeadDim];
  for (int64_t i = 0; i < hd; ++i) u[i] = transpose ? x[i] * sin[i] : x[i];
  const int64_t half = hd / 2;
  for (int64_t i = 0; i < hd; ++i) {
    float rot;  // rot(u)_i
    if (rotate_half) {
      rot = i < half ? -u[i + half] : u[i - half];
    } else {
      rot = i % 2 == 0 ? -u[i + 1] : u[i - 1];
    }
    x[i] = transpose ? x[i] * cos[i] - rot : u[i] * cos[i] + rot * sin[i];
  }
}

// Rotates row r's queries and keys (each nh x hd, keys at +D in a row of qkv or of its gradient) by the table, unless
// the row is a prefix token's.
void rotate_row(const Dims& d, const BlockParameters& p, const BlockShape& shape, int64_t r, float* row,
                bool transpose) {
  const int64_t token = r % d.N - shape.prefix;
  if (token < 0) return;
  const int64_t patches = d.N - shape.prefix;
  const bool per_head = p.rope.dim() == 3;
  const float* table = p.rope.data_ptr<float>();
  for (int64_t h = 0; h < d.heads; ++h) {
    const float* entry = table + ((per_head ? h * patches : 0) + token) * 2 * d.hd;  // sin, then cos
    for (const int64_t part : {int64_t{0}, d.D}) {
      rotate_head(row + part + h * d.hd, d.hd, entry, entry + d.hd, shape.rotate_half, transpose);
    }
  }
}

// One norm over one row of D (the block's two are of one kind); mean_out and rstd_out as layer_norm_row's.
void norm_row(const RowKernels& k, NormLayer kind, const float* x, int64_t D, float eps, const float* weight,
              const float* bias, float* out, float* mean_out, float* rstd_out) {
  if (kind == NormLayer::rmsnorm) {
    k.rms_norm_row(x, D, eps, weight, out, rstd_out);
  } else {
    k.layer_norm_row(x, D, eps, weight, bias, out, mean_out, rstd_out);
  }
}

torch::Tensor forward_pass(const torch::Tensor& x, const BlockParameters& p, const BlockShape& shape,
                           const torch::Tensor& keep1_tensor, const torch::Tensor& keep2_tensor, Saved* saved) {
  const auto d = dims_of(x, p, shape.heads);
  const auto options = x.options();
  const RowKernels& k = row_kernels();
  const bool training = saved != nullptr;
  const Plan plan = plan_for(d, training, p.int8.empty() ? 4 : 1);
  const float eps = static_cast<float>(shape.eps), scale = static_cast<float>(shape.scale);
  const float* keep1 = data_or_null(keep1_tensor);
  const float* keep2 = data_or_null(keep2_tensor);
  const float* gamma1 = data_or_null(p.gamma1);
  const float* gamma2 = data_or_null(p.gamma2);
  const float* xp = x.data_ptr<float>();
  const float *norm1_w = data_or_null(p.norm1_weight), *norm1_b = data_or_null(p.norm1_bias);
  const float *norm2_w = data_or_null(p.norm2_weight), *norm2_b = data_or_null(p.norm2_bias);
  auto full = [&](int64_t width) { return torch::empty({d.R, width}, options); };
  const Products products(p, shape.bf16, plan.packed);
  Saved s;

  // Region 1, rows: norm1, then qkv, then the rotary embeddings on its queries and keys (kept rotated: what the
  // attention's backward reads).
  s.xn1 = full(d.D);
  s.xn1_16 = products.kept(training, d.R, d.D);
  s.qkv = full(3 * d.D);  // (R, 3D): q, k, v, each (nh, hd)
  if (training) s.mean1 = torch::empty({d.R}, options), s.rstd1 = torch::empty({d.R}, options);
  float *xn1 = s.xn1.data_ptr<float>(), *qkv = s.qkv.data_ptr<float>();
  float *mean1 = data_or_null(s.mean1), *rstd1 = data_or_null(s.rstd1);
  std::vector<Step> region1{{false,
                             [&](int64_t r0, int64_t r1) {
                               for (int64_t r = r0; r < r1; ++r) {
                                 norm_row(k, shape.norm, xp + r * d.D, d.D, eps, norm1_w, norm1_b, xn1 + r * d.D,
                                          training ? mean1 + r : nullptr, training ? rstd1 + r : nullptr);
                               }
                             }},
                            {true, [&](int64_t r0, int64_t r1) {
                               products.linear_rows(r0, r1, xn1 + r0 * d.D, p.qkv_weight, p.qkv_bias,
                                                    qkv + r0 * 3 * d.D, 0, Products::row_of(s.xn1_16, r0));
                             }}};
  if (p.rope.numel() > 0) {
    region1.push_back({false, [&](int64_t r0, int64_t r1) {
                         for (int64_t r = r0; r < r1; ++r) rotate_row(d, p, shape, r, qkv + r * 3 * d.D, false);
                       }});
  }

  // Region 2: attention, into these.
  s.att = full(d.D);  // (R, D), heads concatenated
  if (training) s.probs = torch::empty({d.B, d.heads, d.N, d.N}, options);

  // Region 3, rows: proj, the residual add fused with norm2, fc1, its activation, fc2, the residual. What training
  // keeps goes to whole tensors; in inference y goes straight into out, the rest into temporaries (the MLP's
  // output over the spent proj output; a plain MLP's activations over fc1's output).
  auto out = full(d.D);  // (R, D)
  if (training) {
    s.a = full(d.D), s.y = full(d.D), s.xn2 = full(d.D), s.h = full(d.fc1), s.g = full(d.hidden);
    s.mean2 = torch::empty({d.R}, options), s.rstd2 = torch::empty({d.R}, options);
    if (gamma2 != nullptr) s.m = full(d.D);
  }
  s.att16 = products.kept(training, d.R, d.D), s.xn2_16 = products.kept(training, d.R, d.D);
  s.g16 = products.kept(training, d.R, d.hidden);
  const Temporary spare(plan, 0, d.R, d.D, options, !training || gamma2 == nullptr);  // a (inference), m
  const Temporary xn2_temp(plan, 1, d.R, d.D, options, !training), h_temp(plan, 2, d.R, d.fc1, options, !training);
  const Temporary g_temp(plan, 3, d.R, d.hidden, options, !training && d.gated);
  const float* att = s.att.data_ptr<float>();
  float* out_p = out.data_ptr<float>();
  // Rows [r0, r1) of a kept tensor (training) or of a temporary (inference), starting at row r0.
  auto rows_of = [&](const torch::Tensor& kept, const Temporary& temp, int64_t r0, int64_t r1) {
    return training ? kept.data_ptr<float>() + r0 * kept.size(1) : temp.rows(r0, r1);
  };
  auto y_rows = [&](int64_t r0) { return training ? s.y.data_ptr<float>() + r0 * d.D : out_p + r0 * d.D; };
  auto m_rows = [&](int64_t r0, int64_t r1) {
    return training && gamma2 != nullptr ? s.m.data_ptr<float>() + r0 * d.D : spare.rows(r0, r1);
  };
  auto g_rows = [&](int64_t r0, int64_t r1) {
    if (training) return s.g.data_ptr<float>() + r0 * d.hidden;
    return d.gated ? g_temp.rows(r0, r1) : h_temp.rows(r0, r1);  // a plain MLP's in place over h
  };
  float *mean2 = data_or_null(s.mean2), *rstd2 = data_or_null(s.rstd2);
  // A plain MLP in inference on a packed fc1: its activation in fc1's kernel, over h in place (LibTorch's GELU on
  // the tile cost 5-7% of ViT-Ti/16's batch-1 latency).
  const bool act_in_fc1 = !training && !d.gated && products.packed(p.fc1_weight);
  const bool with_derivative = gelu_with_derivative_applies(training, d.gated, shape.act);
  const std::vector<Step> region3{
      {true,
       [&](int64_t r0, int64_t r1) {
         products.linear_rows(r0, r1, att + r0 * d.D, p.proj_weight, p.proj_bias, rows_of(s.a, spare, r0, r1), 0,
                              Products::row_of(s.att16, r0));
       }},
      {false,
       [&](int64_t r0, int64_t r1) {
         const float* a = rows_of(s.a, spare, r0, r1);
         float *y = y_rows(r0), *xn2 = rows_of(s.xn2, xn2_temp, r0, r1);
         for (int64_t i = 0; i < r1 - r0; ++i) {
           const int64_t r = r0 + i;
           k.add_branch_row(xp + r * d.D, a + i * d.D, gamma1, keep_at(keep1, r, d.N), d.D, y + i * d.D);
           norm_row(k, shape.norm, y + i * d.D, d.D, eps, norm2_w, norm2_b, xn2 + i * d.D,
                    training ? mean2 + r : nullptr, training ? rstd2 + r : nullptr);
         }
       }},
      {true,
       [&](int64_t r0, int64_t r1) {
         fc1_rows(d, p, products, r0, r1, rows_of(s.xn2, xn2_temp, r0, r1), rows_of(s.h, h_temp, r0, r1),
                  Products::row_of(s.xn2_16, r0), act_in_fc1 ? &shape.act : nullptr);
       }},
      {!with_derivative,  // LibTorch's activations spread over the threads themselves; the row kernel does not
       [&](int64_t r0, int64_t r1) {
         if (act_in_fc1) return;
         if (with_derivative) {
           k.gelu_with_derivative(rows_of(s.h, h_temp, r0, r1), g_rows(r0, r1), (r1 - r0) * d.hidden);
           return;
         }
         mlp_activation(rows_of(s.h, h_temp, r0, r1), g_rows(r0, r1), r1 - r0, d.hidden, d.gated, shape.act);
       }},
      {true,
       [&](int64_t r0, int64_t r1) {
         products.linear_rows(r0, r1, g_rows(r0, r1), p.fc2_weight, p.fc2_bias, m_rows(r0, r1), 0,
                              Products::row_of(s.g16, r0));
       }},
      {false, [&](int64_t r0, int64_t r1) {
         const float *m = m_rows(r0, r1), *y = y_rows(r0);
         for (int64_t i = 0; i < r1 - r0; ++i) {
           k.add_branch_row(y + i * d.D, m + i * d.D, gamma2, keep_at(keep2, r0 + i, d.N), d.D, out_p + (r0 + i) * d.D);
         }
       }}};
  if (plan.one_region) {
    // Lane t: rows [t per, (t + 1) per), whose queries it takes through the attention, image by image.
    const int64_t lanes = at::get_num_threads(), per = (d.R + lanes - 1) / lanes;
    auto first_row = [&](int64_t lane) { return std::min(d.R, lane * per); };
    two_phases(
        lanes, [&](int64_t lane) { run_range(plan, region1, first_row(lane), first_row(lane + 1)); },
        [&](int64_t lane) {
          const int64_t r0 = first_row(lane), r1 = first_row(lane + 1);
          for (int64_t b = r0 / d.N; b * d.N < r1; ++b) {
            const int64_t first = std::max(r0, b * d.N) - b * d.N, end = std::min(r1, (b + 1) * d.N) - b * d.N;
            for (int64_t h = 0; h < d.heads; ++h) {
              attention_query_rows(d, k, scale, s.qkv, s.probs, s.att, b, h, first, end - first);
            }
          }
          run_range(plan, region3, r0, r1);
        });
  } else if (by_images(d, plan)) {
    for_images(d, [&](int64_t r0, int64_t r1, int64_t b0, int64_t b1) {
      run_range(plan, region1, r0, r1);
      attention_forward_items(d, k, scale, s.qkv, s.probs, s.att, 1, b0 * d.heads, b1 * d.heads);
      run_range(plan, region3, r0, r1);
    });
  } else {
    run_steps(d.R, plan, region1);
    attention_forward(d, k, scale, s.qkv, s.probs, s.att);
    run_steps(d.R, plan, region3);
  }
  if (training) *saved = s;
  return out;
}

// Per-thread partial sums of the backward's gradients (biases, norms, LayerScale and, in a pass by images, the
// weights), all in one (threads, width) buffer of zeros: each thread adds into its own row, and one sum over the
// threads totals them all once the regions are over. One zeros and one sum a block, where a buffer per gradient made
// up to 15 of each (LibTorch's profiler, the default's step: 85 zeros and 78 sums, 2.65 ms, before; 6 and 12, 1.69 ms,
// after).
class PartialSums {
 public:
  // One gradient's columns [at, at + width).
  struct Partial {
    PartialSums* sums;
    int64_t at, width;
    float* mine() const { return sums->sums_.data_ptr<float>() + at::get_thread_num() * sums->width_ + at; }
    // Summed over the threads.
    torch::Tensor total() const { return sums->total().narrow(0, at, width); }
  };
  // Every reserve before allocate.
  Partial reserve(int64_t width) {
    const Partial partial{this, width_, width};
    width_ += width;
    return partial;
  }
  void allocate(const torch::TensorOptions& options) { sums_ = torch::zeros({at::get_num_threads(), width_}, options); }

 private:
  const torch::Tensor& total() {
    if (!total_.defined()) total_ = sums_.sum(0);
    return total_;
  }
  int64_t width_ = 0;
  torch::Tensor sums_, total_;  // (threads, width), then (width)
};
using Partial = PartialSums::Partial;

// Gradients, in BlockFunction's input order after x: norm1 w, b, qkv w, b, proj w, b, gamma1, norm2 w, b, fc1 w, b,
// fc1v w, b, fc2 w, b, gamma2. Undefined for a parameter the block lacks.
struct Gradients {
  torch::Tensor x, norm1_weight, norm1_bias, qkv_weight, qkv_bias, proj_weight, proj_bias, gamma1, norm2_weight,
      norm2_bias, fc1_weight, fc1_bias, fc1v_weight, fc1v_bias, fc2_weight, fc2_bias, gamma2;
};

// The backward's region 2 on the calling thread, for (image, head) pairs [pair0, pair1): d(attention output) datt
// (R, D) -> their rows' and heads' columns of d(qkv) dqkv (R, 3D).
void attention_backward_pairs(const Dims& d, const RowKernels& k, float scale, const Saved& s,
                              const torch::Tensor& datt, const torch::Tensor& dqkv, int64_t pair0, int64_t pair1) {
  const int64_t row = 3 * d.D;
  const float* q_all = s.qkv.data_ptr<float>();
  const float* probs = s.probs.data_ptr<float>();
  const float* datt_p = datt.data_ptr<float>();
  float* dq_all = dqkv.data_ptr<float>();
  float* ds = scratch(0, d.N * std::max<int64_t>(d.N, 64));  // (N, N), or (N, 64) for the short kernels
  for (int64_t pair = pair0; pair < pair1; ++pair) {
    const int64_t b = pair / d.heads, h = pair % d.heads;
    const float* q = q_all + b * d.N * row + h * d.hd;  // k at +D, v at +2D
    float* dq = dq_all + b * d.N * row + h * d.hd;
    const float* prob = probs + pair * d.N * d.N;
    const float* dhead = datt_p + b * d.N * d.D + h * d.hd;  // (N, hd), row stride D
    if (short_attention_applies(d.N, d.hd)) {
      k.short_attention_backward(prob, dhead, d.D, q, q + d.D, q + 2 * d.D, row, d.N, d.hd, scale, dq, dq + d.D,
                                 dq + 2 * d.D, scratch(1, d.hd * 64), ds);
      continue;
    }
    // dv = P^T dout; dP = dout v^T; dS = softmax'; dq = scale dS k; dk = scale dS^T q
    sgemm('T', 'N', d.N, d.hd, d.N, 1.0f, prob, d.N, dhead, d.D, 0.0f, dq + 2 * d.D, row);
    sgemm('N', 'T', d.N, d.N, d.hd, 1.0f, dhead, d.D, q + 2 * d.D, row, 0.0f, ds, d.N);
    k.softmax_backward_rows(prob, ds, d.N, d.N);
    sgemm('N', 'N', d.N, d.hd, d.N, scale, ds, d.N, q + d.D, row, 0.0f, dq, row);
    sgemm('T', 'N', d.N, d.hd, d.N, scale, ds, d.N, q, row, 0.0f, dq + d.D, row);
  }
}

// One norm's backward over one row (norm_row's): dx = base + d(norm input); dw, db accumulate (db: layer norm only).
void norm_backward_row(const RowKernels& k, NormLayer kind, const float* dout, const float* x, float mean, float rstd,
                       const float* weight, int64_t D, const float* base, float* dx, float* dw, float* db) {
  if (kind == NormLayer::rmsnorm) {
    k.rms_norm_backward_row(dout, x, rstd, weight, D, base, dx, dw);
  } else {
    k.layer_norm_backward_row(dout, x, mean, rstd, weight, D, base, dx, dw, db);
  }
}

Gradients backward_pass(const torch::Tensor& x, const BlockParameters& p, const BlockShape& shape,
                        const torch::Tensor& keep1_tensor, const torch::Tensor& keep2_tensor, const Saved& s,
                        const torch::Tensor& grad_out) {
  const auto d = dims_of(x, p, shape.heads);
  const auto options = x.options();
  const RowKernels& k = row_kernels();
  const Plan plan = plan_for(d, /*training=*/true);
  const float scale = static_cast<float>(shape.scale);
  const float* keep1 = data_or_null(keep1_tensor);
  const float* keep2 = data_or_null(keep2_tensor);
  const float* gamma1 = data_or_null(p.gamma1);
  const float* gamma2 = data_or_null(p.gamma2);
  const float* dout = grad_out.data_ptr<float>();
  // What the row loops read, as pointers: a data_ptr call per row and tensor was 1.4% of the default's float32 step.
  const float *xp = x.data_ptr<float>(), *m = data_or_null(s.m), *y = s.y.data_ptr<float>(), *a = s.a.data_ptr<float>();
  const float *mean1 = s.mean1.data_ptr<float>(), *rstd1 = s.rstd1.data_ptr<float>();
  const float *mean2 = s.mean2.data_ptr<float>(), *rstd2 = s.rstd2.data_ptr<float>();
  const float *norm1_w = p.norm1_weight.data_ptr<float>(), *norm2_w = p.norm2_weight.data_ptr<float>();
  auto full = [&](int64_t width) { return torch::empty({d.R, width}, options); };
  const Products products(p, shape.bf16, /*packed=*/false);
  const bool with_derivative = gelu_with_derivative_applies(/*training=*/true, d.gated, shape.act);

  PartialSums sums;
  const Partial dgamma1 = sums.reserve(d.D), dgamma2 = sums.reserve(d.D), dproj_bias = sums.reserve(d.D),
                dfc1_bias = sums.reserve(d.fc1), dfc2_bias = sums.reserve(d.D), dnorm2_w = sums.reserve(d.D),
                dnorm2_b = sums.reserve(d.D), dnorm1_w = sums.reserve(d.D), dnorm1_b = sums.reserve(d.D),
                dqkv_bias = sums.reserve(3 * d.D);

  // Region 1, rows: the MLP branch and norm2 back to the residual stream y, then LayerScale and proj back to the
  // attention's output. The whole-row tensors are what the weight gradients read.
  auto dm = full(d.D);        // d(fc2 output)
  auto dh = full(d.fc1);      // d(fc1 output), before the activation
  auto dg = d.gated ? full(d.hidden) : dh;  // d(fc2 input): a plain MLP's over dh, in place
  auto dy = full(d.D);        // d(y), the residual stream between the branches
  auto da = full(d.D);        // d(proj output)
  auto datt = full(d.D);      // d(attention output), heads concatenated
  const Temporary dxn2(plan, 0, d.R, d.D, options);
  // Their rounded copies where the products run in bfloat16, for the weight gradients.
  const auto dm16 = products.kept(true, d.R, d.D), dh16 = products.kept(true, d.R, d.fc1),
             da16 = products.kept(true, d.R, d.D);
  auto at = [](const torch::Tensor& kept, int64_t r0) { return Products::row_of(kept, r0); };
  float *dm_p = dm.data_ptr<float>(), *dh_p = dh.data_ptr<float>(), *dg_p = dg.data_ptr<float>(),
        *dy_p = dy.data_ptr<float>(), *da_p = da.data_ptr<float>();
  const std::vector<Step> region1{
      {false,
       [&](int64_t r0, int64_t r1) {
         float *dgamma = gamma2 ? dgamma2.mine() : nullptr, *dbias = dfc2_bias.mine();
         for (int64_t r = r0; r < r1; ++r) {
           k.branch_backward_row(dout + r * d.D, gamma2 ? m + r * d.D : nullptr, gamma2, keep_at(keep2, r, d.N), d.D,
                                 dm_p + r * d.D, dgamma, dbias);
         }
       }},
      {true,
       [&](int64_t r0, int64_t r1) {
         products.backward_rows(r0, r1, dm_p + r0 * d.D, p.fc2_weight, dg_p + r0 * d.hidden, 0, 0.0f, at(dm16, r0));
       }},
      {!with_derivative,
       [&](int64_t r0, int64_t r1) {
         if (with_derivative) {  // dh = dg act'(h), in place (dh is dg), the derivative kept by the forward
           // A loop: at::mul_out took 110 us a call here (the default's 1,024 x 256 values a thread; LibTorch's
           // profiler).
           float* dh_rows = dh_p + r0 * d.fc1;
           const float* derivative = s.h.data_ptr<float>() + r0 * d.fc1;
           for (int64_t i = 0, count = (r1 - r0) * d.fc1; i < count; ++i) dh_rows[i] *= derivative[i];
           return;
         }
         mlp_activation_backward(s.h.data_ptr<float>() + r0 * d.fc1, dg_p + r0 * d.hidden, dh_p + r0 * d.fc1, r1 - r0,
                                 d.hidden, d.gated, shape.act);
       }},
      {false,
       [&](int64_t r0, int64_t r1) {
         float* dfc1_b = dfc1_bias.mine();
         for (int64_t r = r0; r < r1; ++r) k.add_row(dh_p + r * d.fc1, d.fc1, dfc1_b);
       }},
      {true,
       [&](int64_t r0, int64_t r1) {
         uint16_t* dh_rounded = at(dh16, r0);
         products.backward_rows(r0, r1, dh_p + r0 * d.fc1, p.fc1_weight, dxn2.rows(r0, r1), d.fc1, 0.0f, dh_rounded);
         if (d.gated) {
           products.backward_rows(r0, r1, dh_p + r0 * d.fc1 + d.hidden, p.fc1v_weight, dxn2.rows(r0, r1), d.fc1, 1.0f,
                                  dh_rounded == nullptr ? nullptr : dh_rounded + d.hidden);
         }
       }},
      {false,
       [&](int64_t r0, int64_t r1) {
         const float* dxn = dxn2.rows(r0, r1);
         float *dw = dnorm2_w.mine(), *db = dnorm2_b.mine();
         float *dgamma = gamma1 ? dgamma1.mine() : nullptr, *dbias = dproj_bias.mine();
         for (int64_t i = 0; i < r1 - r0; ++i) {
           const int64_t r = r0 + i;
           norm_backward_row(k, shape.norm, dxn + i * d.D, y + r * d.D, mean2[r], rstd2[r], norm2_w, d.D,
                             dout + r * d.D, dy_p + r * d.D, dw, db);
           k.branch_backward_row(dy_p + r * d.D, a + r * d.D, gamma1, keep_at(keep1, r, d.N), d.D, da_p + r * d.D,
                                 dgamma, dbias);
         }
       }},
      {true, [&](int64_t r0, int64_t r1) {
         products.backward_rows(r0, r1, da_p + r0 * d.D, p.proj_weight, datt.data_ptr<float>() + r0 * d.D, 0, 0.0f,
                                at(da16, r0));
       }}};

  // Region 2, the attention core's backward, writes dqkv; region 3, rows: the rotary embeddings' backward, then qkv
  // and norm1 back to x, plus the residual path.
  auto dqkv = full(3 * d.D);
  auto dx = full(d.D);
  float* dx_p = dx.data_ptr<float>();
  const Temporary dxn1(plan, 0, d.R, d.D, options);
  float* dqkv_p = dqkv.data_ptr<float>();
  const auto dqkv16 = products.kept(true, d.R, 3 * d.D);
  std::vector<Step> region3;
  if (p.rope.numel() > 0) {
    region3.push_back({false, [&](int64_t r0, int64_t r1) {
                         for (int64_t r = r0; r < r1; ++r) rotate_row(d, p, shape, r, dqkv_p + r * 3 * d.D, true);
                       }});
  }
  region3.insert(region3.end(),
                 {{false,
                   [&](int64_t r0, int64_t r1) {
                     float* dqkv_b = dqkv_bias.mine();
                     for (int64_t r = r0; r < r1; ++r) k.add_row(dqkv_p + r * 3 * d.D, 3 * d.D, dqkv_b);
                   }},
                  {true,
                   [&](int64_t r0, int64_t r1) {
                     products.backward_rows(r0, r1, dqkv_p + r0 * 3 * d.D, p.qkv_weight, dxn1.rows(r0, r1), 0, 0.0f,
                                            at(dqkv16, r0));
                   }},
                  {false, [&](int64_t r0, int64_t r1) {
                     const float* dxn = dxn1.rows(r0, r1);
                     float *dw = dnorm1_w.mine(), *db = dnorm1_b.mine();
                     for (int64_t i = 0; i < r1 - r0; ++i) {
                       const int64_t r = r0 + i;
                       norm_backward_row(k, shape.norm, dxn + i * d.D, xp + r * d.D, mean1[r], rstd1[r], norm1_w, d.D,
                                         dy_p + r * d.D, dx_p + r * d.D, dw, db);
                     }
                   }}});
  // The weight gradients, dout^T in over the batch's rows. A pass by images adds each thread's share, over its own
  // rows, into the thread's partial sum in the same region, where those rows were just computed, and sums the threads'
  // partials after it: the Fashion-MNIST default's float32 step 1.03-1.07x faster than with one product on all threads
  // after the region (medians of 4 runs of 200 steps, the two ways alternating step by step in one process). Otherwise
  // each is one whole-batch product on every thread.
  struct WeightGrad {
    const torch::Tensor& weight;
    const float* dout;
    int64_t ld;
    const uint16_t* dout16;
    const torch::Tensor& in;
    const uint16_t* in16;
    torch::Tensor& grad;
  };
  Gradients grads;
  const uint16_t* dh_rounded = at(dh16, 0);
  std::vector<WeightGrad> weight_grads{
      {p.fc2_weight, dm_p, d.D, at(dm16, 0), s.g, at(s.g16, 0), grads.fc2_weight},
      {p.fc1_weight, dh_p, d.fc1, dh_rounded, s.xn2, at(s.xn2_16, 0), grads.fc1_weight},
      {p.proj_weight, da_p, d.D, at(da16, 0), s.att, at(s.att16, 0), grads.proj_weight},
      {p.qkv_weight, dqkv_p, 3 * d.D, at(dqkv16, 0), s.xn1, at(s.xn1_16, 0), grads.qkv_weight}};
  if (d.gated) {
    weight_grads.push_back({p.fc1v_weight, dh_p + d.hidden, d.fc1,
                            dh_rounded == nullptr ? nullptr : dh_rounded + d.hidden, s.xn2, at(s.xn2_16, 0),
                            grads.fc1v_weight});
  }
  const bool images = by_images(d, plan);
  std::vector<Partial> partials;  // by images: (out x in) each, none for a weight that needs no gradient
  if (images) {
    for (const auto& w : weight_grads) {
      partials.push_back(sums.reserve(w.weight.requires_grad() ? w.weight.numel() : 0));
    }
  }
  sums.allocate(options);
  if (images) {
    for_images(d, [&](int64_t r0, int64_t r1, int64_t b0, int64_t b1) {
      run_range(plan, region1, r0, r1);
      attention_backward_pairs(d, k, scale, s, datt, dqkv, b0 * d.heads, b1 * d.heads);
      run_range(plan, region3, r0, r1);
      for (size_t i = 0; i < weight_grads.size(); ++i) {
        const auto& w = weight_grads[i];
        if (!w.weight.requires_grad()) continue;
        products.weight_grad_rows(r0, r1, w.dout, w.in, w.weight, w.ld, w.dout16, w.in16, 1.0f, partials[i].mine());
      }
    });
    for (size_t i = 0; i < weight_grads.size(); ++i) {
      auto& w = weight_grads[i];
      if (w.weight.requires_grad()) w.grad = partials[i].total().view(w.weight.sizes());
    }
  } else {
    run_steps(d.R, plan, region1);
    at::parallel_for(0, d.B * d.heads, 1, [&](int64_t pair0, int64_t pair1) {
      attention_backward_pairs(d, k, scale, s, datt, dqkv, pair0, pair1);
    });
    run_steps(d.R, plan, region3);
    for (const auto& w : weight_grads) w.grad = products.weight_grad(w.dout, w.in, w.weight, w.ld, w.dout16, w.in16);
  }

  // A bias the block lacks had its partial sums computed all the same (cheaper than a branch per row).
  auto present = [](const torch::Tensor& parameter, const Partial& sum) {
    return parameter.numel() > 0 ? sum.total() : torch::Tensor();
  };
  grads.x = dx.view(x.sizes());
  grads.norm1_weight = dnorm1_w.total(), grads.norm1_bias = present(p.norm1_bias, dnorm1_b);
  grads.qkv_bias = present(p.qkv_bias, dqkv_bias);
  grads.proj_bias = present(p.proj_bias, dproj_bias);
  if (gamma1 != nullptr) grads.gamma1 = dgamma1.total();
  grads.norm2_weight = dnorm2_w.total(), grads.norm2_bias = present(p.norm2_bias, dnorm2_b);
  if (p.fc1_bias.numel() > 0) {
    const auto fc1_bias = dfc1_bias.total();
    grads.fc1_bias = fc1_bias.narrow(0, 0, d.hidden);
    if (d.gated) grads.fc1v_bias = fc1_bias.narrow(0, d.hidden, d.hidden);
  }
  grads.fc2_bias = present(p.fc2_bias, dfc2_bias);
  if (gamma2 != nullptr) grads.gamma2 = dgamma2.total();
  return grads;
}

// Differentiable wrapper. Absent tensors (biases, fc1v, gammas, the rotary table, keep factors) come as empty (0)
// tensors: LibTorch 1.13's custom functions reject undefined inputs. Inputs: x, the parameters in BlockParameters'
// order, keep1, keep2, then the shape.
constexpr int kParameters = 17;

struct BlockFunction : torch::autograd::Function<BlockFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& norm1_weight,
                               const torch::Tensor& norm1_bias, const torch::Tensor& qkv_weight,
                               const torch::Tensor& qkv_bias, const torch::Tensor& proj_weight,
                               const torch::Tensor& proj_bias, const torch::Tensor& gamma1,
                               const torch::Tensor& norm2_weight, const torch::Tensor& norm2_bias,
                               const torch::Tensor& fc1_weight, const torch::Tensor& fc1_bias,
                               const torch::Tensor& fc1v_weight, const torch::Tensor& fc1v_bias,
                               const torch::Tensor& fc2_weight, const torch::Tensor& fc2_bias,
                               const torch::Tensor& gamma2, const torch::Tensor& rope, const torch::Tensor& keep1,
                               const torch::Tensor& keep2, int64_t heads, double scale, double eps, int64_t act,
                               int64_t norm, int64_t prefix, bool rotate_half, bool bf16) {
    // clang-format off
    const BlockParameters p{norm1_weight, norm1_bias,  qkv_weight,  qkv_bias,   proj_weight, proj_bias,
                            gamma1,       norm2_weight, norm2_bias, fc1_weight, fc1_bias,    fc1v_weight,
                            fc1v_bias,    fc2_weight,   fc2_bias,   gamma2,     rope,       nullptr,
                            {}};  // training: no int8
    // clang-format on
    const BlockShape shape{heads,  scale,       eps, static_cast<Activation>(act), static_cast<NormLayer>(norm),
                           prefix, rotate_half, bf16};
    Saved s;
    auto out = forward_pass(x, p, shape, keep1, keep2, &s);
    auto or_empty = [&](const torch::Tensor& t) { return t.defined() ? t : torch::empty({0}, x.options()); };
    // clang-format off
    ctx->save_for_backward({x, norm1_weight, norm1_bias, qkv_weight, qkv_bias, proj_weight, proj_bias, gamma1,
                            norm2_weight, norm2_bias, fc1_weight, fc1_bias, fc1v_weight, fc1v_bias, fc2_weight,
                            fc2_bias, gamma2, rope, keep1, keep2,
                            s.xn1, s.mean1, s.rstd1, s.qkv, s.probs, s.att, s.a, s.y, s.mean2, s.rstd2, s.xn2, s.h,
                            s.g, or_empty(s.m), or_empty(s.xn1_16), or_empty(s.att16), or_empty(s.xn2_16),
                            or_empty(s.g16)});
    // clang-format on
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["act"] = act;
    ctx->saved_data["norm"] = norm;
    ctx->saved_data["prefix"] = prefix;
    ctx->saved_data["rotate_half"] = rotate_half;
    ctx->saved_data["bf16"] = bf16;
    return out.view(x.sizes());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto v = ctx->get_saved_variables();
    const auto& x = v[0];
    BlockParameters p{v[1],  v[2],  v[3],  v[4],  v[5],  v[6],  v[7],  v[8],  v[9],
                      v[10], v[11], v[12], v[13], v[14], v[15], v[16], v[17], nullptr, {}};
    // Saved variables lose requires_grad; weight_grad asks it, so hand over what autograd needs instead.
    auto needs = [&](int index, torch::Tensor& t) { t = t.detach().requires_grad_(ctx->needs_input_grad(index)); };
    needs(3, p.qkv_weight), needs(5, p.proj_weight), needs(10, p.fc1_weight), needs(12, p.fc1v_weight),
        needs(14, p.fc2_weight);
    const BlockShape shape{ctx->saved_data["heads"].toInt(),
                           ctx->saved_data["scale"].toDouble(),
                           ctx->saved_data["eps"].toDouble(),
                           static_cast<Activation>(ctx->saved_data["act"].toInt()),
                           static_cast<NormLayer>(ctx->saved_data["norm"].toInt()),
                           ctx->saved_data["prefix"].toInt(),
                           ctx->saved_data["rotate_half"].toBool(),
                           ctx->saved_data["bf16"].toBool()};
    const int keep = 1 + kParameters;
    int saved = keep + 2;
    Saved s;
    for (auto* t : {&s.xn1, &s.mean1, &s.rstd1, &s.qkv, &s.probs, &s.att, &s.a, &s.y, &s.mean2, &s.rstd2, &s.xn2, &s.h,
                    &s.g, &s.m, &s.xn1_16, &s.att16, &s.xn2_16, &s.g16}) {
      *t = v[saved++];
    }
    // Empty placeholders (no LayerScale, float32 products) stand for absent tensors again.
    for (auto* t : {&s.xn1_16, &s.att16, &s.xn2_16, &s.g16}) {
      if (t->numel() == 0) *t = torch::Tensor();
    }
    const auto g = backward_pass(x, p, shape, v[keep], v[keep + 1], s, grad_outputs[0].contiguous());
    auto only = [&](int index, const torch::Tensor& t) { return ctx->needs_input_grad(index) ? t : torch::Tensor(); };
    // clang-format off
    variable_list grads{only(0, g.x),
                        only(1, g.norm1_weight), only(2, g.norm1_bias), g.qkv_weight,         only(4, g.qkv_bias),
                        g.proj_weight,           only(6, g.proj_bias),  only(7, g.gamma1),    only(8, g.norm2_weight),
                        only(9, g.norm2_bias),   g.fc1_weight,          only(11, g.fc1_bias), g.fc1v_weight,
                        only(13, g.fc1v_bias),   g.fc2_weight,          only(15, g.fc2_bias), only(16, g.gamma2)};
    // clang-format on
    grads.resize(grads.size() + 3 + 8);  // the rotary table, keep1, keep2 and the shape: none
    return grads;
  }
};

bool cpu_float(const torch::Tensor& t) { return t.is_cpu() && t.scalar_type() == torch::kFloat32; }

}  // namespace

bool fused_block_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("VIT_FUSED_BLOCK");
    return value == nullptr || std::string(value) != "0";
  }();
  return enabled;
}

bool fused_block_applies(const torch::Tensor& x, const BlockParameters& p) {
  if (!fused_block_enabled() || !cpu_kernels_available() || !cpu_float(x) || x.dim() != 3 || x.numel() == 0) {
    return false;
  }
  for (const auto* t :
       {&p.norm1_weight, &p.qkv_weight, &p.proj_weight, &p.norm2_weight, &p.fc1_weight, &p.fc2_weight}) {
    if (!t->defined() || !cpu_float(*t)) return false;
  }
  for (const auto* t : {&p.norm1_bias, &p.qkv_bias, &p.proj_bias, &p.gamma1, &p.norm2_bias, &p.fc1_bias, &p.fc1v_weight,
                        &p.fc1v_bias, &p.fc2_bias, &p.gamma2, &p.rope}) {
    if (t->defined() && !cpu_float(*t)) return false;
  }
  return true;
}

torch::Tensor fused_block(const torch::Tensor& x, const BlockParameters& parameters, const BlockShape& shape,
                          const torch::Tensor& keep1, const torch::Tensor& keep2) {
  TORCH_CHECK(fused_block_applies(x, parameters), "fused block: needs CPU float32 (B, N, D) input and parameters, got ",
              x.sizes(), " ", x.scalar_type(), " on ", x.device());
  TORCH_CHECK(shape.norm == NormLayer::rmsnorm || (parameters.norm1_bias.defined() && parameters.norm2_bias.defined()),
              "fused block: layer norm without a bias");
  TORCH_CHECK(!parameters.fc1v_weight.defined() || parameters.fc1_bias.defined() == parameters.fc1v_bias.defined(),
              "fused block: a gated MLP with a bias on only one of fc1 and fc1v");
  if (const auto& rope = parameters.rope; rope.defined()) {
    const int64_t N = x.size(1), hd = x.size(2) / shape.heads;
    TORCH_CHECK(!rope.requires_grad() && (rope.dim() == 2 || (rope.dim() == 3 && rope.size(0) == shape.heads)) &&
                    rope.size(-2) == N - shape.prefix && rope.size(-1) == 2 * hd && hd % 2 == 0 &&
                    hd <= kMaxRotaryHeadDim,
                "fused block: rotary table ", rope.sizes(), " does not fit ", N - shape.prefix,
                " patch tokens of head dim ", hd, " and ", shape.heads, " heads (or asks for a gradient)");
  }
  auto contiguous = [](const torch::Tensor& t) { return t.defined() ? t.contiguous() : t; };
  // clang-format off
  const BlockParameters p{contiguous(parameters.norm1_weight), contiguous(parameters.norm1_bias),
                          contiguous(parameters.qkv_weight),   contiguous(parameters.qkv_bias),
                          contiguous(parameters.proj_weight),  contiguous(parameters.proj_bias),
                          contiguous(parameters.gamma1),       contiguous(parameters.norm2_weight),
                          contiguous(parameters.norm2_bias),   contiguous(parameters.fc1_weight),
                          contiguous(parameters.fc1_bias),     contiguous(parameters.fc1v_weight),
                          contiguous(parameters.fc1v_bias),    contiguous(parameters.fc2_weight),
                          contiguous(parameters.fc2_bias),     contiguous(parameters.gamma2),
                          contiguous(parameters.rope),         parameters.packed,
                          parameters.int8};
  const std::array<const torch::Tensor*, kParameters> all{
      &p.norm1_weight, &p.norm1_bias,   &p.qkv_weight, &p.qkv_bias,   &p.proj_weight, &p.proj_bias,
      &p.gamma1,       &p.norm2_weight, &p.norm2_bias, &p.fc1_weight, &p.fc1_bias,    &p.fc1v_weight,
      &p.fc1v_bias,    &p.fc2_weight,   &p.fc2_bias,   &p.gamma2,     &p.rope};
  // clang-format on
  const auto input = x.contiguous();
  const auto keep_1 = contiguous(keep1), keep_2 = contiguous(keep2);
  bool grad = torch::GradMode::is_enabled() && input.requires_grad();
  for (const auto* t : all) grad = grad || (torch::GradMode::is_enabled() && t->defined() && t->requires_grad());
  if (!grad) return forward_pass(input, p, shape, keep_1, keep_2, nullptr).view(x.sizes());
  auto e = [&](const torch::Tensor& t) { return t.defined() ? t : torch::empty({0}, x.options()); };
  return BlockFunction::apply(
      input, e(p.norm1_weight), e(p.norm1_bias), e(p.qkv_weight), e(p.qkv_bias), e(p.proj_weight), e(p.proj_bias),
      e(p.gamma1), e(p.norm2_weight), e(p.norm2_bias), e(p.fc1_weight), e(p.fc1_bias), e(p.fc1v_weight), e(p.fc1v_bias),
      e(p.fc2_weight), e(p.fc2_bias), e(p.gamma2), e(p.rope), e(keep_1), e(keep_2), shape.heads, shape.scale, shape.eps,
      static_cast<int64_t>(shape.act), static_cast<int64_t>(shape.norm), shape.prefix, shape.rotate_half, shape.bf16);
}

}  // namespace vit
