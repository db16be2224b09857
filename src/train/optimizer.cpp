// Flat-buffer AdamW; the CPU update is one fused pass over parameters, gradients and both moments.
#include "train/optimizer.h"
#include "train/adamw_update.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace vit {

double layer_decay_scale(const std::string& name, int64_t depth, double decay) {
  return std::pow(decay, static_cast<double>(depth + 1 - layer_of(name, depth)));
}

std::vector<std::string> freeze_parameters(const std::vector<std::pair<std::string, torch::Tensor>>& named_parameters,
                                           const std::vector<std::string>& prefixes) {
  std::vector<std::string> frozen;
  for (const auto& prefix : prefixes) {
    bool matched = false;
    for (const auto& [name, parameter] : named_parameters) {
      if (!parameter_in(name, prefix)) continue;
      matched = true;
      if (!parameter.requires_grad()) continue;  // an earlier prefix froze it already
      parameter.requires_grad_(false);
      frozen.push_back(name);
    }
    if (!matched) {
      std::vector<std::string> tops;  // the first components, to say what there is
      for (const auto& item : named_parameters) {
        std::string top = item.first.substr(0, item.first.find('.'));
        if (top == "blocks") top = "blocks.0";
        if (std::find(tops.begin(), tops.end(), top) == tops.end()) tops.push_back(top);
      }
      std::string list;
      for (const auto& top : tops) list.append(list.empty() ? "" : ", ").append(top);
      throw std::invalid_argument(VIT_TRAIN_KEY(freeze) + ": \"" + prefix +
                                  "\" matches no parameter of the model (it has " + list +
                                  ", ...; or \"backbone\" for all but the head)");
    }
  }
  const bool any_left = std::any_of(named_parameters.begin(), named_parameters.end(),
                                    [](const auto& item) { return item.second.requires_grad(); });
  if (!any_left) {
    throw std::invalid_argument(VIT_TRAIN_KEY(freeze) + " freezes every parameter: nothing is left to train");
  }
  return frozen;
}

FlatAdamW::FlatAdamW(const std::vector<std::pair<std::string, torch::Tensor>>& named_parameters,
                     const TrainConfig& config, const LrScale& lr_scale)
    : beta1_(config.beta1), beta2_(config.beta2), eps_(config.eps), weight_decay_(config.weight_decay) {
  if (named_parameters.empty()) throw std::invalid_argument("FlatAdamW: no parameters");
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& [name, p] : named_parameters) {
      if (!p.requires_grad()) continue;
      if (no_weight_decay(name, p) == (pass == 0)) continue;
      named_.emplace_back(name, p);
      if (pass == 0) decay_size_ += p.numel();
    }
  }
  if (named_.empty()) throw std::invalid_argument("FlatAdamW: no trainable parameters");
  int64_t total = 0;
  for (const auto& [name, p] : named_) {
    total += p.numel();
    const double scale = lr_scale ? lr_scale(name) : 1.0;
    if (!segments_.empty() && segments_.back().lr_scale == scale) {
      segments_.back().end = total;
    } else {
      segments_.push_back({total, scale});
    }
  }
  const auto options = named_.front().second.options().requires_grad(false);
  params_ = torch::empty({total}, options);
  grads_ = torch::zeros({total}, options);
  exp_avg_ = torch::zeros({total}, options);
  exp_avg_sq_ = torch::zeros({total}, options);
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (auto& [name, p] : named_) {
    const int64_t n = p.numel();
    auto param_view = params_.narrow(0, offset, n).view(p.sizes());
    param_view.copy_(p);
    p.set_data(param_view);  // the module's parameter now lives in the flat buffer
    p.mutable_grad() = grads_.narrow(0, offset, n).view(p.sizes());  // autograd accumulates in place
    offset += n;
  }
  if (segments_.size() > 1) {
    std::vector<float> scales(static_cast<size_t>(total));
    int64_t begin = 0;
    for (const auto& segment : segments_) {
      std::fill(scales.begin() + begin, scales.begin() + segment.end, static_cast<float>(segment.lr_scale));
      begin = segment.end;
    }
    lr_scales_ = torch::tensor(scales).to(options.device()).to(options.dtype());
  }
}

void FlatAdamW::zero_grad() { grads_.zero_(); }

double FlatAdamW::clip_grad_norm(double max_norm) {
  torch::NoGradGuard no_grad;
  const double norm = grads_.norm().item<double>();
  if (max_norm > 0.0 && std::isfinite(norm) && norm > max_norm) grads_.mul_(max_norm / (norm + 1e-6));
  return norm;
}

void FlatAdamW::step(double lr) {
  torch::NoGradGuard no_grad;
  ++steps_;
  const double bias1 = 1.0 - std::pow(beta1_, static_cast<double>(steps_));
  const double bias2 = 1.0 - std::pow(beta2_, static_cast<double>(steps_));
  const double step_size = lr / bias1;
  const double bias2_sqrt = std::sqrt(bias2);
  if (params_.is_cpu() && params_.scalar_type() == torch::kFloat32) {
    // One pass over four arrays, in the same arithmetic order as torch.optim.AdamW (non-foreach), each segment with
    // its param group's lr, the decayed prefix with weight decay (train/adamw_update.h).
    float* p = params_.data_ptr<float>();
    const float* g = grads_.data_ptr<float>();
    float* m = exp_avg_.data_ptr<float>();
    float* v = exp_avg_sq_.data_ptr<float>();
    std::vector<AdamWScalars> scalars(segments_.size());
    for (size_t s = 0; s < segments_.size(); ++s) {
      const double group_lr = lr * segments_[s].lr_scale;
      scalars[s] = {static_cast<float>(beta1_),
                    static_cast<float>(beta2_),
                    static_cast<float>(eps_),
                    static_cast<float>(bias2_sqrt),
                    static_cast<float>(group_lr / bias1),
                    static_cast<float>(1.0 - group_lr * weight_decay_)};
    }
    const int64_t decay_end = decay_size_;
    at::parallel_for(0, params_.numel(), 1 << 14, [&](int64_t begin, int64_t end) {
      size_t s = std::upper_bound(segments_.begin(), segments_.end(), begin,
                                  [](int64_t i, const Segment& segment) { return i < segment.end; }) -
                 segments_.begin();
      for (int64_t i = begin; i < end; ++s) {
        const int64_t stop = std::min(end, segments_[s].end);
        // [i, stop) within one segment, split where the decayed prefix ends.
        const int64_t split = std::clamp(decay_end, i, stop);
        adamw_update(p + i, g + i, m + i, v + i, split - i, scalars[s], true);
        adamw_update(p + split, g + split, m + split, v + split, stop - split, scalars[s], false);
        i = stop;
      }
    });
    bump_versions();
    return;
  }
  // Other devices: the same update as a few whole-buffer tensor operations (per-element lr scales when they differ).
  if (decay_size_ > 0) {
    auto decayed = params_.narrow(0, 0, decay_size_);
    if (lr_scales_.defined()) {
      decayed.addcmul_(decayed, lr_scales_.narrow(0, 0, decay_size_), -lr * weight_decay_);
    } else {
      decayed.mul_(1.0 - lr * weight_decay_);
    }
  }
  exp_avg_.mul_(beta1_).add_(grads_, 1.0 - beta1_);
  exp_avg_sq_.mul_(beta2_).addcmul_(grads_, grads_, 1.0 - beta2_);
  auto denom = (exp_avg_sq_.sqrt() / bias2_sqrt).add_(eps_);
  params_.addcdiv_(lr_scales_.defined() ? exp_avg_ * lr_scales_ : exp_avg_, denom, -step_size);
  bump_versions();
}

void FlatAdamW::bump_versions() {
  for (auto& [name, parameter] : named_) parameter.unsafeGetTensorImpl()->bump_version();
}

std::vector<std::pair<std::string, torch::Tensor>> FlatAdamW::state() const {
  return {{"optimizer.exp_avg", exp_avg_},
          {"optimizer.exp_avg_sq", exp_avg_sq_},
          {"optimizer.steps", torch::tensor({steps_}, torch::kInt64)}};
}

void FlatAdamW::load_state(const std::vector<std::pair<std::string, torch::Tensor>>& state) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : state) {
    if (name == "optimizer.exp_avg" || name == "optimizer.exp_avg_sq") {
      auto& target = name == "optimizer.exp_avg" ? exp_avg_ : exp_avg_sq_;
      if (t.numel() != target.numel()) {
        throw std::runtime_error("optimizer state " + name + " has " + std::to_string(t.numel()) +
                                 " values, the model has " + std::to_string(target.numel()) + " parameters");
      }
      target.copy_(t.view(target.sizes()));
    } else if (name == "optimizer.steps") {
      steps_ = t.item<int64_t>();
    }
  }
}

ScopedWeights::ScopedWeights(torch::Tensor& params, const torch::Tensor& weights) : params_(params) {
  if (weights.data_ptr() == params.data_ptr()) return;
  torch::NoGradGuard no_grad;
  backup_ = params.clone();
  params.copy_(weights);
}

ScopedWeights::~ScopedWeights() {
  if (!backup_.defined()) return;
  torch::NoGradGuard no_grad;
  params_.copy_(backup_);
}

}  // namespace vit
