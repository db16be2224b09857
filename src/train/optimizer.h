// AdamW over flat buffers: every parameter becomes a view into one contiguous buffer (and every gradient into
// another), so zeroing, clipping, all-reducing and the update are a few large operations instead of hundreds of
// small ones. Parameters are ordered decay group first, then the no-decay group (1-D tensors, pos_embed, cls_token).
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "config/config.h"
#include "model/param_names.h"

namespace vit {

// train.layer_decay: a parameter's learning-rate scale, decay^(depth + 1 - layer_of(name)) (model/param_names.h):
// 1 for the head, decay^(depth + 1) for patch_embed.
double layer_decay_scale(const std::string& name, int64_t depth, double decay);

// train.freeze: marks every parameter that one of `prefixes` matches as not requiring a gradient and returns their
// names (model/param_names.h's parameter_in: whole dotted components; "backbone" is all but head.*). Throws naming a
// prefix that matches nothing, and when nothing would be left to train.
std::vector<std::string> freeze_parameters(const std::vector<std::pair<std::string, torch::Tensor>>& named_parameters,
                                           const std::vector<std::string>& prefixes);

// A parameter's learning-rate multiplier, by name (layer decay); empty = 1 for all.
using LrScale = std::function<double(const std::string& name)>;

class FlatAdamW {
 public:
  // Rebinds every trainable parameter's storage into the flat buffer (values kept); parameters that require no
  // gradient (train.freeze) are left out: no state, no decay, not clipped. Parameters must already be on their final
  // device and dtype: moving the module afterwards would detach it from the buffers. Each parameter's update uses
  // lr * lr_scale(name), its weight decay included, as a torch.optim param group with that lr would.
  FlatAdamW(const std::vector<std::pair<std::string, torch::Tensor>>& named_parameters, const TrainConfig& config,
            const LrScale& lr_scale = {});

  void zero_grad();
  // Global L2 norm of all gradients before clipping; scales them to max_norm when above (max_norm 0 = no clip).
  double clip_grad_norm(double max_norm);
  // One AdamW update at learning rate `lr` times each parameter's scale (decoupled weight decay on the decay group
  // only).
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
  // The parameters alias the buffer, which the update writes, so their own version counters would not move: moved
  // here, so that what caches a weight by its version (model/fused_block.h's PackedProducts) sees the change.
  void bump_versions();

  // A run of the buffer whose parameters share one lr scale (one run for the whole buffer without layer decay).
  struct Segment {
    int64_t end;  // one past its last element; it starts where the previous one ends
    double lr_scale;
  };
  std::vector<std::pair<std::string, torch::Tensor>> named_;  // in buffer order
  std::vector<Segment> segments_;
  torch::Tensor params_, grads_, exp_avg_, exp_avg_sq_;
  torch::Tensor lr_scales_;  // (P) per element, for the non-CPU update; undefined with a single segment
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
