// AdamW over flat buffers: every parameter becomes a view into one contiguous buffer (and every gradient into
// another), so zeroing, clipping, all-reducing and the update are a few large operations instead of hundreds of
// small ones. Parameters are ordered decay group first, then the no-decay group (1-D tensors, pos_embed, cls_token).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "config/config.h"

namespace vit {

// True for parameters that get no weight decay: biases, norm weights, LayerScale, pos_embed, cls_token.
bool no_weight_decay(const std::string& name, const torch::Tensor& parameter);

class FlatAdamW {
 public:
  // Rebinds every parameter's storage into the flat buffer (values kept). Parameters must already be on their
  // final device and dtype: moving the module afterwards would detach it from the buffers.
  FlatAdamW(const std::vector<std::pair<std::string, torch::Tensor>>& named_parameters, const TrainConfig& config);

  void zero_grad();
  // Global L2 norm of all gradients before clipping; scales them to max_norm when above (max_norm 0 = no clip).
  double clip_grad_norm(double max_norm);
  // One AdamW update at learning rate `lr` (decoupled weight decay on the decay group only).
  void step(double lr);

  torch::Tensor& params() { return params_; }      // (P) all parameters
  torch::Tensor& grads() { return grads_; }        // (P) all gradients
  int64_t decay_size() const { return decay_size_; }
  int64_t steps() const { return steps_; }
  const std::vector<std::pair<std::string, torch::Tensor>>& named() const { return named_; }

  // Moments and step count, for exact resume.
  std::vector<std::pair<std::string, torch::Tensor>> state() const;
  void load_state(const std::vector<std::pair<std::string, torch::Tensor>>& state);

 private:
  std::vector<std::pair<std::string, torch::Tensor>> named_;  // in buffer order
  torch::Tensor params_, grads_, exp_avg_, exp_avg_sq_;
  int64_t decay_size_ = 0;
  int64_t steps_ = 0;
  double beta1_, beta2_, eps_, weight_decay_;
};

// Puts `weights` (a flat buffer shaped like params(): the EMA, say) into the live parameters for the lifetime of the
// scope, and the live values back at its end, so the model can be evaluated or saved with them. A no-op when
// `weights` is the parameter buffer itself.
class ScopedWeights {
 public:
  ScopedWeights(torch::Tensor& params, const torch::Tensor& weights);
  ~ScopedWeights();
  ScopedWeights(const ScopedWeights&) = delete;
  ScopedWeights& operator=(const ScopedWeights&) = delete;

 private:
  torch::Tensor& params_;
  torch::Tensor backup_;  // undefined when nothing was swapped
};

}  // namespace vit
