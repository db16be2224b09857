// Rotary position embeddings (model/rope.h), operation for operation as timm's, so that the float32 tables agree
// with timm's to the last bit where the operations allow.
#include "model/rope.h"

#include <cmath>

namespace vit {
namespace {

constexpr double kPi = 3.14159265358979323846;

// (..., hd/2) per-frequency values -> (..., hd): [f0, f1, .., f0, f1, ..] for rotate_half, else [f0, f0, f1, f1, ..].
torch::Tensor rope_layout(const torch::Tensor& x, bool rotate_half) {
  return rotate_half ? torch::cat({x, x}, -1) : x.repeat_interleave(2, -1);
}

// One axis's coordinates, the grid's axes ordered as `indexing` says: (gh, gw, 2).
torch::Tensor coordinate_grid(std::array<int64_t, 2> grid, GridIndexing indexing,
                              const std::function<torch::Tensor(int64_t axis, int64_t size)>& axis_values) {
  std::array<int64_t, 2> shape = grid;
  if (indexing == GridIndexing::xy) std::swap(shape[0], shape[1]);
  std::vector<torch::Tensor> axes{axis_values(0, shape[0]), axis_values(1, shape[1])};
  auto mesh = torch::meshgrid(axes, indexing == GridIndexing::xy ? "xy" : "ij");
  return torch::stack(mesh, -1);  // (gh, gw, 2): spatial layout always (gh, gw)
}

}  // namespace

RotaryEmbeddingImpl::RotaryEmbeddingImpl(const ModelConfig& config)
    : type(config.rope_type),
      head_dim(config.head_dim()),
      depth(config.depth),
      num_heads(config.num_heads),
      temperature(config.rope_temperature),
      grid_offset(config.rope_grid_offset),
      indexing(config.rope_grid_indexing),
      rotate_half(config.rope_rotate_half),
      ref_feat{config.ref_feat_h, config.ref_feat_w},
      shift_coords(config.rope_shift_coords),
      jitter_coords(config.rope_jitter_coords),
      rescale_coords(config.rope_rescale_coords) {
  if (type == RopeType::mixed) {
    freqs = register_parameter("freqs", torch::zeros({2, depth, num_heads, head_dim / 2}));
  }
}

void RotaryEmbeddingImpl::reset_parameters() {
  if (!freqs.defined()) return;
  torch::NoGradGuard no_grad;
  // timm's init_random_2d_freqs: magnitudes 1 / T^(4i / hd), rotated by a random angle per block and head.
  auto mag = torch::pow(temperature, torch::arange(0, head_dim, 4, torch::kFloat32) / head_dim).reciprocal();
  mag = mag.view({1, 1, -1});
  auto angles = torch::rand({depth, num_heads, 1}) * 2 * kPi;
  auto fx = torch::cat({mag * torch::cos(angles), mag * torch::cos(angles + kPi / 2)}, -1);
  auto fy = torch::cat({mag * torch::sin(angles), mag * torch::sin(angles + kPi / 2)}, -1);
  freqs.copy_(torch::stack({fx, fy}, 0));
}

torch::Tensor RotaryEmbeddingImpl::frequencies() const {
  const int64_t bands = head_dim / 4;
  if (type == RopeType::cat) {
    return torch::pow(temperature, torch::arange(0, bands, torch::kInt64).to(torch::kFloat32) / bands).reciprocal();
  }
  if (type == RopeType::dinov3) {
    return torch::pow(temperature, 2.0 * torch::arange(bands, torch::kFloat32) / (head_dim / 2));
  }
  return {};
}

torch::Tensor RotaryEmbeddingImpl::augment(const torch::Tensor& coords) const {
  if (!is_training() || (!shift_coords && !jitter_coords && !rescale_coords)) return coords;
  // timm's _apply_coord_augs, its draws in its order: a shift per axis, a log-uniform scale per axis, one shared scale.
  auto out = coords;  // (Np, 2)
  const auto options = coords.options();
  if (shift_coords) out = out + torch::empty({2}, options).uniform_(-*shift_coords, *shift_coords).unsqueeze(0);
  if (jitter_coords) {
    const double most = std::log(*jitter_coords);
    out = out * torch::empty({2}, options).uniform_(-most, most).exp().unsqueeze(0);
  }
  if (rescale_coords) {
    const double most = std::log(*rescale_coords);
    out = out * torch::empty({1}, options).uniform_(-most, most).exp();
  }
  return out;
}

torch::Tensor RotaryEmbeddingImpl::embed(std::array<int64_t, 2> grid) const {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  if (type == RopeType::mixed) {
    // get_mixed_grid: patch indices, then t_x * freqs_x + t_y * freqs_y per block and head.
    auto coords = coordinate_grid(grid, indexing, [&](int64_t, int64_t size) {
                    return torch::arange(size, torch::kInt64).to(torch::kFloat32);
                  }).reshape({-1, 2});
    coords = augment(coords);
    auto f = freqs.to(torch::kFloat32);
    auto t_x = coords.select(1, 0).contiguous().to(f.device()), t_y = coords.select(1, 1).contiguous().to(f.device());
    auto combined =
        t_x.unsqueeze(-1) * f[0].unsqueeze(-2) + t_y.unsqueeze(-1) * f[1].unsqueeze(-2);  // (depth, nh, Np, hd/2)
    return torch::cat({rope_layout(combined.sin(), false), rope_layout(combined.cos(), false)}, -1);
  }
  torch::Tensor angles;  // (Np, hd / 2)
  if (type == RopeType::cat) {
    // RotaryEmbeddingCat with in_pixels false: bands 1 / T^(i / nb) over patch indices (+ offset), rescaled to
    // ref_feat_shape when set (EVA-02's rule for other sizes).
    const auto band = frequencies();
    std::array<int64_t, 2> ref = ref_feat;
    if (indexing == GridIndexing::xy) std::swap(ref[0], ref[1]);
    auto coords = coordinate_grid(grid, indexing, [&](int64_t axis, int64_t size) {
      auto t = torch::arange(size, torch::kInt64).to(torch::kFloat32) + grid_offset;
      if (ref[0] > 0) t = t / size * ref[axis];
      return t;
    });
    coords = augment(coords.flatten(0, -2));  // (Np, 2)
    angles = (coords.unsqueeze(-1) * band).flatten(1);
  } else {
    // RotaryEmbeddingDinoV3: periods T^(2i / (hd/2)) over patch centres, each axis normalised by its size to [-1, 1].
    const auto periods = frequencies();
    auto coords = coordinate_grid(grid, indexing, [&](int64_t, int64_t size) {
      return (torch::arange(0.5, static_cast<double>(size), f32) + grid_offset) / static_cast<double>(size);
    });
    coords = augment((2.0 * coords - 1.0).flatten(0, -2));  // (Np, 2)
    angles = (2 * kPi * coords.unsqueeze(-1) / periods.view({1, 1, -1})).flatten(1);
  }
  return torch::cat({rope_layout(angles.sin(), rotate_half), rope_layout(angles.cos(), rotate_half)}, -1);
}

torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& rope, int64_t prefix, bool rotate_half) {
  const int64_t N = x.size(2);
  auto patches = x.narrow(2, prefix, N - prefix);  // (B, nh, Np, hd)
  auto parts = rope.chunk(2, -1);
  const auto& sin = parts[0];
  const auto& cos = parts[1];
  torch::Tensor rotated;
  if (rotate_half) {
    auto halves = patches.chunk(2, -1);
    rotated = torch::cat({-halves[1], halves[0]}, -1);  // [-x_{hd/2..}, x_{..hd/2}]
  } else {
    using torch::indexing::None;
    using torch::indexing::Slice;
    rotated = torch::stack({-patches.index({"...", Slice(1, None, 2)}), patches.index({"...", Slice(0, None, 2)})}, -1)
                  .reshape(patches.sizes());  // [-x1, x0, -x3, x2, ...]
  }
  auto out = (patches * cos + rotated * sin).to(x.dtype());
  return prefix == 0 ? out : torch::cat({x.narrow(2, 0, prefix), out}, 2);
}

}  // namespace vit
