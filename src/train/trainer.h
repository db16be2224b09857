// `vit train`: the training loop (AdamW, warmup + cosine, accumulation, clipping, EMA, AMP on CUDA), run directory
// (config, metrics, curves, model files) and exact resume from a saved training state.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "config/config.h"
#include "data/augment.h"
#include "data/dataset.h"
#include "model/vit.h"
#include "train/history.h"

namespace vit {

// What the core library cannot do by itself (OpenCV lives in the vision library); all optional.
struct TrainHooks {
  std::shared_ptr<const ImageCodec> codec;  // decodes folder/csv/wds datasets (null: built without OpenCV)
  std::function<RawAugment(int64_t ops, double magnitude)> make_randaugment;
  std::function<void(const std::string& png_path, const std::vector<CurvePanel>& panels)> plot_curves;
};

struct TrainRequest {
  Config config;
  std::string config_name = "run";  // names new run directories: <output_root>/<config_name>-<timestamp>
  std::string out_dir;     // explicit run directory ("" = a new one under output_root)
  std::string resume_dir;  // continue this run exactly (its config.json wins)
  std::string init_from;   // fine-tune from this model file (ours or timm's)
};

struct TrainResult {
  std::string run_dir;
  int64_t steps = 0;
  double best_top1 = 0.0;
  double final_top1 = 0.0;
  Weights final_weights = Weights::model;  // what final.safetensors holds (train.final_weights)
  double seconds = 0.0;    // wall time including evaluation and data loading
  double target_top1 = 0.0;         // train.target_top1 (0 = none)
  double seconds_to_target = -1.0;  // wall time when eval top-1 first reached it (-1 = never, or no target)
  std::vector<EpochRecord> history;
};

TrainResult train(const TrainRequest& request, const TrainHooks& hooks = {});

// What train.amp auto means on a device: bf16 on CUDA (autocast; Ampere and later run it natively), bf16 on a CPU with
// AMX and a build with oneDNN (the fused blocks' products), float32 (AmpMode::off) on any other CPU, where bfloat16
// products train more slowly than float32 ones (cpu_has_amx_bf16, model/precision.h). Any other mode is returned as
// it is.
AmpMode resolve_amp(AmpMode amp, const torch::Device& device);

// Sets up the mixed precision `amp` for training net on device (train.amp; bench's --amp) and returns what runs. On
// CUDA: autocast, which the caller scopes (bf16, or fp16 with loss scaling). On the CPU, bf16: the fused blocks'
// linear products in bfloat16 with float32 accumulation (VisionTransformerImpl::set_bf16_products), said once in
// the log, with a warning where the CPU lacks AMX (slower than float32 there). auto: resolve_amp's choice, said with
// its reason. Anything else (fp16 on the CPU, a CPU without AVX512_BF16 or AMX, a build without oneDNN) warns with the
// reason and returns AmpMode::off: float32. setting names the option in those lines.
AmpMode apply_amp(VisionTransformer& net, AmpMode amp, const torch::Device& device, const std::string& setting);

// The training loss: soft-target cross-entropy when `soft_targets` is defined (mixup/cutmix, already smoothed),
// otherwise label-smoothed cross-entropy on `labels`.
torch::Tensor classification_loss(const torch::Tensor& logits, const torch::Tensor& labels,
                                  const torch::Tensor& soft_targets, double smoothing);

// Asks a running train() to stop at the next step boundary after saving its state (SIGINT/SIGTERM handlers).
void request_stop();
bool stop_requested();

// Thrown when training stops on request; the run can be continued with --resume.
struct TrainingInterrupted : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The CPU generator's state (dropout, drop-path, init), saved and restored for exact resume.
torch::Tensor rng_state();
void set_rng_state(const torch::Tensor& state);

}  // namespace vit
