// The training loop. train() reads as the loop itself; the Training class below holds what it works on and names
// each step (set-up, one optimiser step, its log line, the end of an epoch, the resume state). Everything that
// decides the next update is in state.safetensors (run_state.h), so --resume continues bit-exactly.
#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "data/loader.h"
#include "io/model_file.h"
#include "model/autocast.h"
#include "model/precision.h"
#include "train/distributed.h"
#include "train/evaluate.h"
#include "train/loss_scaler.h"
#include "train/optimizer.h"
#include "train/run_dir.h"
#include "train/run_state.h"
#include "train/schedule.h"
#include "util/fs.h"
#include "util/log.h"
#include "util/progress.h"
#include "util/runtime.h"

namespace vit {
using nlohmann::json;

namespace {

std::atomic<bool> stop_flag{false};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

class EpochBar {
 public:
  EpochBar() : tty_(::isatty(::fileno(stderr)) != 0) {}
  bool tty() const { return tty_; }
  void update(int64_t epoch, int64_t epochs, int64_t step, int64_t steps, double loss, double lr, double img_s,
              double epoch_eta_s, double run_eta_s) {
    if (!tty_) return;
    const int width = 24;
    const int filled = steps > 0 ? static_cast<int>(width * step / steps) : 0;
    std::string bar(filled, '=');
    if (filled < width) bar += '>' + std::string(width - filled - 1, ' ');
    std::fprintf(stderr, "\r\033[Kepoch %lld/%lld [%s] %lld/%lld loss %.4f lr %.2e %.0f img/s ETA %s, run %s",
                 static_cast<long long>(epoch), static_cast<long long>(epochs), bar.c_str(),
                 static_cast<long long>(step), static_cast<long long>(steps), loss, lr, img_s,
                 format_duration(epoch_eta_s).c_str(), format_duration(run_eta_s).c_str());
    std::fflush(stderr);
  }
  void end_line() {
    if (tty_) std::fprintf(stderr, "\n");
  }

 private:
  bool tty_;
};

// The config a run trains with: the request's, or for --resume the run's own config.json.
Config run_config(const TrainRequest& request) {
  if (request.resume_dir.empty()) return request.config;
  log::info("resuming " + request.resume_dir + " with its own config.json");
  return load_config(request.resume_dir + "/config.json");
}

torch::Device training_device(const TrainConfig& tc, const DistEnv& env) {
  torch::Device device = resolve_device(tc.device);
  if (device.is_cuda() && env.world_size > 1) device = torch::Device(torch::kCUDA, env.local_rank);
  return device;
}

}  // namespace

AmpMode resolve_amp(AmpMode amp, const torch::Device& device) {
  if (amp != AmpMode::automatic) return amp;
  if (device.is_cuda()) return AmpMode::bf16;
  return device.is_cpu() && cpu_has_amx_bf16() && cpu_bf16_refusal().empty() ? AmpMode::bf16 : AmpMode::off;
}

AmpMode apply_amp(VisionTransformer& net, AmpMode amp, const torch::Device& device, const std::string& setting) {
  const AmpMode resolved = resolve_amp(amp, device);
  if (amp == AmpMode::automatic) {
    const std::string why = device.is_cuda() ? "bf16 autocast on " + device.str()
                            : resolved == AmpMode::bf16
                                ? "bf16 products (this CPU has AMX)"
                                : "float32 on " + device.str() + " (" + cpu_precision_features() +
                                      "): bfloat16 products train faster than float32 only with AMX";
    log::info(setting + " auto: " + why);
  }
  if (resolved == AmpMode::off || device.is_cuda()) return resolved;
  const std::string asked = setting + " " + name_of(resolved);
  std::string refusal = !device.is_cpu()            ? "mixed precision runs on CUDA or the CPU"
                        : resolved == AmpMode::fp16 ? "fp16 mixed precision needs CUDA (on the CPU use bf16)"
                                                    : cpu_bf16_refusal();
  if (!refusal.empty()) {
    log::warn(asked + ": " + refusal + "; running in float32 on " + device.str());
    return AmpMode::off;
  }
  net->set_bf16_products(true);
  log::info(asked + " on the CPU: the fused blocks' linear layers multiply in bfloat16 (float32 accumulation; " +
            cpu_precision_features() + "), everything else in float32");
  if (!cpu_has_amx_bf16()) {
    log::warn(asked +
              " on a CPU without AMX: bfloat16 products may train more slowly than float32 (0.62-0.76x "
              "float32's img/s on an Intel Xeon with AVX512_BF16 alone, README); " +
              setting + " auto or off trains in float32");
  }
  return resolved;
}

namespace {

// What one optimiser step reports.
struct StepResult {
  double loss = 0.0;       // mean over micro-batches and ranks
  double lr = 0.0;
  double grad_norm = 0.0;  // before clipping
  double seconds = 0.0;
  bool stop = false;       // some rank was asked to stop: every rank stops after this step
};

class Training {
 public:
  Training(const TrainRequest& request, const TrainHooks& hooks);

  bool epochs_left() const { return rs_.epoch < tc_.epochs && !reached_max_; }
  bool steps_left_in_epoch() const;
  void start_epoch();
  StepResult step();
  void after_step(const StepResult& step);  // progress bar, metrics line, periodic resume state; throws to stop
  void end_epoch();                          // evaluate, model files, history, resume state, summary
  TrainResult finish();

 private:
  void load_resume_state(const std::string& path);
  void save_state();
  void save_model_file(const std::string& name, Weights which);
  EvalResult evaluate_weights(const torch::Tensor& weights);
  [[noreturn]] void diverged(const std::string& what, const std::string& where = "") const;

  const Clock::time_point run_start_ = Clock::now();
  Config config_;
  const TrainConfig& tc_ = config_.train;
  const DistEnv env_;
  const std::string run_dir_;  // this run's directory (--resume's, --out, or a new one under output_root)
  RunLock lock_;               // held by the main rank from the start: a second run into run_dir_ stops at once
  torch::Device device_;
  std::unique_ptr<Communicator> comm_;
  bool amp_, fp16_;
  Splits splits_;
  std::vector<std::string> class_names_;
  int64_t num_classes_;
  std::optional<Loader> train_loader_, eval_loader_;
  int64_t steps_per_epoch_ = 0, images_per_step_ = 0;
  std::optional<Schedule> schedule_;
  VisionTransformer net_{nullptr};
  std::vector<std::pair<std::string, torch::Tensor>> named_parameters_;
  std::vector<std::string> frozen_;  // train.freeze: parameters outside the optimiser, kept in the resume state
  std::optional<FlatAdamW> optimizer_;
  std::optional<GradientReducer> reducer_;
  torch::Tensor ema_;  // flat EMA of the parameters (undefined when train.ema_decay is 0)
  LossScaler scaler_;
  RunState rs_;
  std::optional<RunDirectory> dir_;
  std::map<std::string, std::string> model_metadata_;
  std::function<void(const std::string&, const std::vector<CurvePanel>&)> plot_curves_;
  EpochBar progress_;
  bool reached_max_ = false;
  double last_top1_ = std::nan("");
  double last_lr_ = 0.0;
  // The current log interval.
  Clock::time_point interval_start_;
  int64_t interval_images_ = 0;
  double interval_comm_s_ = 0.0;  // waiting for the gradient all-reduce after backward (what overlap left over)
};

// The lock of a run directory, made first when `create` (a new run); a resumed run's directory must exist.
RunLock lock_run_dir(const std::string& dir, bool create) {
  if (create) make_dirs(dir);
  std::error_code error;
  if (!std::filesystem::is_directory(dir, error)) throw std::runtime_error(dir + ": no such run directory");
  return RunLock(dir);
}

Training::Training(const TrainRequest& request, const TrainHooks& hooks)
    : config_(run_config(request)),
      env_(dist_env_from_environment()),
      run_dir_(!request.resume_dir.empty() ? request.resume_dir
               : !request.out_dir.empty()  ? request.out_dir
                                           : tc_.output_root + "/" + new_run_name(request.config_name)),
      lock_(env_.rank == 0 ? lock_run_dir(run_dir_, /*create=*/request.resume_dir.empty()) : RunLock()),
      device_((configure_threads(static_cast<int>(config_.train.threads)), training_device(config_.train, env_))),
      comm_(make_communicator(env_, tc_, device_)),
      amp_(tc_.amp != AmpMode::off && device_.is_cuda()),
      fp16_(amp_ && tc_.amp == AmpMode::fp16),
      splits_(open_datasets(config_.data, tc_.seed, hooks.codec)),
      class_names_(splits_.train->class_names()),
      num_classes_(static_cast<int64_t>(class_names_.size())),
      scaler_(fp16_),
      plot_curves_(hooks.plot_curves) {
  const bool resuming = !request.resume_dir.empty();
  if (env_.world_size > 1) log::set_prefix("[rank " + std::to_string(env_.rank) + "] ");
  if (config_.model.num_classes != num_classes_) {
    log::info(VIT_MODEL_KEY(num_classes) + " " + std::to_string(config_.model.num_classes) + " -> " +
              std::to_string(num_classes_) + " (the dataset's classes)");
    config_.model.num_classes = num_classes_;
  }

  // ---- data ----
  RawAugment raw_augment;
  const auto& augment = config_.data.augment;
  if (augment.randaugment_ops > 0) {
    if (!hooks.make_randaugment) {
      throw std::invalid_argument(VIT_AUGMENT_KEY(randaugment_ops) + " needs a build with OpenCV");
    }
    raw_augment = hooks.make_randaugment(augment.randaugment_ops, augment.randaugment_magnitude);
  }
  LoaderOptions train_options;
  train_options.batch_size = tc_.batch_size;
  train_options.shuffle = true;
  train_options.drop_last = true;
  train_options.seed = tc_.seed;
  train_options.num_workers = config_.data.num_workers;
  train_options.prefetch = config_.data.prefetch_batches;
  train_options.rank = env_.rank;
  train_options.world_size = env_.world_size;
  train_options.skip_bad_images = config_.data.on_bad_image == BadImagePolicy::skip;
  train_options.pin_memory = device_.is_cuda();
  train_loader_.emplace(splits_.train, make_train_transform(config_.data, config_.model, raw_augment), train_options,
                        make_mix_transform(augment, num_classes_, tc_.label_smoothing));
  LoaderOptions eval_options = train_options;
  eval_options.shuffle = false;
  eval_options.drop_last = false;
  eval_loader_.emplace(splits_.val, make_eval_transform(config_.data, config_.model), eval_options);
  steps_per_epoch_ = train_loader_->batches_per_epoch() / tc_.accum_steps;
  if (steps_per_epoch_ < 1) {
    throw std::invalid_argument(VIT_TRAIN_KEY(batch_size) + " " + std::to_string(tc_.batch_size) + " x accum_steps " +
                                std::to_string(tc_.accum_steps) + " x ranks " + std::to_string(env_.world_size) +
                                " is larger than the training set (" + std::to_string(splits_.train->size()) +
                                " samples)");
  }
  images_per_step_ = tc_.batch_size * tc_.accum_steps * env_.world_size;
  schedule_.emplace(make_schedule(tc_, steps_per_epoch_));

  // ---- model and optimiser ----
  torch::manual_seed(tc_.seed);
  net_ = VisionTransformer(config_.model);
  if (!request.init_from.empty() && !resuming) {
    for (const auto& note : load_for_finetune(request.init_from, net_)) log::info(request.init_from + ": " + note);
  }
  net_->to(device_);
  apply_amp(net_, tc_.amp, device_, VIT_TRAIN_KEY(amp));
  for (const auto& item : net_->named_parameters()) named_parameters_.emplace_back(item.key(), item.value());
  frozen_ = freeze_parameters(named_parameters_, tc_.freeze);
  LrScale lr_scale;
  if (tc_.layer_decay != 1.0) {
    const int64_t depth = config_.model.depth;
    const double decay = tc_.layer_decay;
    lr_scale = [depth, decay](const std::string& name) { return layer_decay_scale(name, depth, decay); };
    char text[160];
    std::snprintf(text, sizeof text,
                  " %g: lr x%.4g for patch_embed and pos_embed .. x%.4g for block %lld .. x1 for the head", decay,
                  std::pow(decay, depth + 1.0), decay, static_cast<long long>(depth - 1));
    log::info(VIT_TRAIN_KEY(layer_decay) + text);
  }
  optimizer_.emplace(named_parameters_, tc_, lr_scale);
  // Averages gradients over ranks, each bucket's all-reduce overlapping the rest of backward (no-op for one rank).
  reducer_.emplace(*comm_, optimizer_->grads(), optimizer_->named(), named_parameters_);
  {
    std::vector<torch::Tensor> params{optimizer_->params()};
    comm_->broadcast(params, 0);  // identical start on every rank
  }
  if (tc_.ema_decay > 0) ema_ = optimizer_->params().detach().clone();
  torch::manual_seed(mix_seed({tc_.seed, 0x64726f70ULL, static_cast<uint64_t>(env_.rank)}));  // dropout stream

  // ---- run directory and resume state ----
  if (resuming) load_resume_state(run_dir_ + "/state.safetensors");
  dir_.emplace(run_dir_, comm_->is_main(), config_,
               resuming ? std::optional<uint64_t>(rs_.metrics_bytes) : std::nullopt);
  model_metadata_ = {{"class_source", name_of(config_.data.format)}};
  reached_max_ = tc_.max_steps > 0 && rs_.global_step >= tc_.max_steps;

  if (!frozen_.empty()) {
    log::info(VIT_TRAIN_KEY(freeze) + ": " + std::to_string(frozen_.size()) + " tensors frozen, " +
              std::to_string(count_parameters(*net_) - optimizer_->params().numel()) + " parameters");
  }
  log::info("training " + std::to_string(optimizer_->params().numel()) + " parameters on " + device_.str() + " for " +
            std::to_string(tc_.epochs) + " epochs x " + std::to_string(steps_per_epoch_) + " steps (batch " +
            std::to_string(tc_.batch_size) + " x accum " + std::to_string(tc_.accum_steps) + " x ranks " +
            std::to_string(env_.world_size) + "), " + std::to_string(splits_.train->size()) + " train / " +
            std::to_string(splits_.val->size()) + " val samples");
  net_->train();
}

void Training::load_resume_state(const std::string& path) {
  const SavedRun saved = read_run_state(path);
  torch::NoGradGuard no_grad;
  auto params = saved.tensor("params");
  if (params.numel() != optimizer_->params().numel()) {
    throw std::runtime_error(path + ": " + std::to_string(params.numel()) + " parameters saved, the model has " +
                             std::to_string(optimizer_->params().numel()));
  }
  optimizer_->params().copy_(params);
  optimizer_->load_state({{"optimizer.exp_avg", saved.tensor("optimizer.exp_avg")},
                          {"optimizer.exp_avg_sq", saved.tensor("optimizer.exp_avg_sq")},
                          {"optimizer.steps", saved.tensor("optimizer.steps")}});
  if (ema_.defined()) ema_.copy_(saved.tensor("ema"));
  // Frozen parameters came from --init-from, which a resumed run does not read again.
  for (const auto& [name, parameter] : named_parameters_) {
    if (std::find(frozen_.begin(), frozen_.end(), name) != frozen_.end()) {
      parameter.copy_(saved.tensor("frozen." + name));
    }
  }
  // The position in the epoch counts per-rank batches and each rank has its own RNG stream: same world size only.
  if (saved.world_size != env_.world_size) {
    throw std::invalid_argument(path + " was saved by " + std::to_string(saved.world_size) + " rank(s); resume it " +
                                "with WORLD_SIZE=" + std::to_string(saved.world_size) + ", not " +
                                std::to_string(env_.world_size));
  }
  set_rng_state(saved.tensor("rng.cpu.rank" + std::to_string(env_.rank)));
  rs_ = saved.state;
  scaler_.restore(rs_.loss_scale, rs_.good_steps);
  log::info("resumed at epoch " + std::to_string(rs_.epoch + 1) + ", step " + std::to_string(rs_.global_step));
}

void Training::save_state() {
  safetensors::NamedTensors tensors{{"params", optimizer_->params().detach().cpu()}};
  for (auto& [name, t] : optimizer_->state()) tensors.emplace_back(name, t.cpu());
  if (ema_.defined()) tensors.emplace_back("ema", ema_.cpu());
  for (const auto& [name, parameter] : named_parameters_) {
    if (!parameter.requires_grad()) tensors.emplace_back("frozen." + name, parameter.detach().cpu().contiguous());
  }
  // Every rank's dropout stream; each rank restores its own.
  const torch::Tensor own = rng_state();
  if (env_.world_size > 1) {
    auto all = torch::zeros({env_.world_size, own.numel()}, torch::kUInt8).to(torch::kFloat64);
    all[env_.rank].copy_(own.to(torch::kFloat64));
    std::vector<torch::Tensor> gathered{all};
    comm_->all_reduce_sum(gathered);
    for (int r = 0; r < env_.world_size; ++r) {
      tensors.emplace_back("rng.cpu.rank" + std::to_string(r), gathered[0][r].to(torch::kUInt8).contiguous());
    }
  } else {
    tensors.emplace_back("rng.cpu.rank0", own);
  }
  if (!dir_->writer()) return;
  RunState saved = rs_;
  saved.metrics_bytes = dir_->metrics_bytes();
  saved.elapsed_seconds = rs_.elapsed_seconds + seconds_since(run_start_);
  saved.loss_scale = scaler_.raw_scale();
  saved.good_steps = scaler_.good_steps();
  write_run_state(dir_->file("state.safetensors"), tensors, saved, env_.world_size);
  rs_.metrics_bytes = saved.metrics_bytes;
}

// Writes the trained parameters or their EMA as `name`, its metadata saying which.
void Training::save_model_file(const std::string& name, Weights which) {
  if (!dir_->writer()) return;
  torch::NoGradGuard no_grad;
  model_metadata_["weights"] = name_of(which);
  ScopedWeights swap(optimizer_->params(), which == Weights::ema ? ema_ : optimizer_->params());
  save_model(dir_->file(name), net_, config_.data.preprocess, class_names_, model_metadata_);
}

EvalResult Training::evaluate_weights(const torch::Tensor& weights) {
  torch::NoGradGuard no_grad;
  ScopedWeights swap(optimizer_->params(), weights);
  return evaluate(net_, *eval_loader_, num_classes_, device_, config_.data.preprocess.eval_hflip, comm_.get());
}

void Training::diverged(const std::string& what, const std::string& where) const {
  throw std::runtime_error("training diverged: " + what + " at step " + std::to_string(rs_.global_step + 1) +
                           " (epoch " + std::to_string(rs_.epoch + 1) + ")" + where + "; the last good checkpoint in " +
                           dir_->path() + " is untouched (try a lower " + VIT_TRAIN_KEY(lr) + " or " +
                           VIT_TRAIN_KEY(clip_grad) + ")");
}

bool Training::steps_left_in_epoch() const { return rs_.step_in_epoch < steps_per_epoch_ && !reached_max_; }

void Training::start_epoch() {
  train_loader_->start_epoch(rs_.epoch, rs_.step_in_epoch * tc_.accum_steps);
  interval_start_ = Clock::now();
  interval_images_ = 0;
  interval_comm_s_ = 0.0;
  last_lr_ = schedule_->lr_at(rs_.global_step);
}

StepResult Training::step() {
  const auto step_start = Clock::now();
  StepResult result;
  optimizer_->zero_grad();
  double bad_loss = 0.0;  // this rank's first non-finite loss of the step (0 = none)
  for (int64_t micro = 0; micro < tc_.accum_steps; ++micro) {
    auto batch = train_loader_->next();
    if (!batch) throw std::runtime_error("data loader ended early in epoch " + std::to_string(rs_.epoch + 1));
    auto images = batch->images.to(device_, /*non_blocking=*/true);
    auto labels = batch->labels.to(device_, /*non_blocking=*/true);
    auto soft = batch->soft_targets.defined() ? batch->soft_targets.to(device_, true) : torch::Tensor();
    torch::Tensor loss;
    {
      AutocastScope autocast(amp_, fp16_ ? at::kHalf : at::kBFloat16);
      loss = classification_loss(net_->forward(images), labels, soft, tc_.label_smoothing);
    }
    const double value = loss.item<double>();
    if (!std::isfinite(value) && bad_loss == 0.0) bad_loss = value;
    if (bad_loss != 0.0 && env_.world_size == 1) break;
    result.loss += value / static_cast<double>(tc_.accum_steps);
    if (micro + 1 == tc_.accum_steps) reducer_->arm();  // this backward completes the step's gradients
    (loss * (scaler_.scale() / static_cast<double>(tc_.accum_steps))).backward();
  }
  const auto comm_start = Clock::now();
  reducer_->finish();
  interval_comm_s_ += seconds_since(comm_start);
  // One small all-reduce: the loss over all ranks (what one process with the global batch would log), and whether
  // any rank was asked to stop (a signal may reach one rank only), so that all stop after this step. A rank whose
  // loss is not finite still ran its backward (its peers' all-reduce needs its gradients), and says so here: every
  // rank then stops with the cause, not only the rank that saw it.
  const auto shared =
      sum_over_ranks(*comm_, {result.loss, stop_requested() ? 1.0 : 0.0, bad_loss != 0.0 ? 1.0 : 0.0});
  result.loss = shared[0] / env_.world_size;
  result.stop = shared[1] > 0.0;
  if (shared[2] > 0.0) {
    std::string where;
    if (env_.world_size > 1) {
      where = " on " + std::to_string(static_cast<int64_t>(shared[2])) + " of " + std::to_string(env_.world_size) +
              " ranks" + (bad_loss != 0.0 ? " (this one included)" : "");
    }
    diverged("loss is " + std::to_string(bad_loss != 0.0 ? bad_loss : result.loss), where);
  }
  if (scaler_.enabled()) optimizer_->grads().div_(scaler_.scale());
  result.grad_norm = optimizer_->clip_grad_norm(tc_.clip_grad);
  result.lr = schedule_->lr_at(rs_.global_step);
  if (!std::isfinite(result.grad_norm) && !scaler_.enabled()) {
    diverged("gradient norm is " + std::to_string(result.grad_norm));
  }
  if (scaler_.update(std::isfinite(result.grad_norm))) {  // an fp16 overflow skips the update
    optimizer_->step(result.lr);
    if (ema_.defined()) {
      torch::NoGradGuard no_grad;
      ema_.mul_(tc_.ema_decay).add_(optimizer_->params(), 1.0 - tc_.ema_decay);
    }
  }
  last_lr_ = result.lr;
  ++rs_.global_step;
  // train.max_steps ends the epoch here and is its last (an epoch that would start after it is not recorded).
  if (tc_.max_steps > 0 && rs_.global_step >= tc_.max_steps) reached_max_ = true;
  ++rs_.step_in_epoch;
  rs_.epoch_loss_sum += result.loss;
  ++rs_.epoch_loss_count;
  rs_.epoch_images += images_per_step_;
  interval_images_ += images_per_step_;
  result.seconds = seconds_since(step_start);
  rs_.epoch_seconds += result.seconds;
  return result;
}

void Training::after_step(const StepResult& step) {
  const bool main_rank = dir_->writer();
  // ETAs at this epoch's training speed (evaluation and checkpoints not counted).
  const double img_s = rs_.epoch_seconds > 0 ? rs_.epoch_images / rs_.epoch_seconds : 0.0;
  const double step_s = img_s > 0 ? images_per_step_ / img_s : 0.0;
  const int64_t epoch_left = steps_per_epoch_ - rs_.step_in_epoch;
  int64_t run_left = epoch_left + (tc_.epochs - rs_.epoch - 1) * steps_per_epoch_;
  if (tc_.max_steps > 0) run_left = std::min(run_left, tc_.max_steps - rs_.global_step);
  const double epoch_eta = std::min(epoch_left, run_left) * step_s, run_eta = run_left * step_s;
  if (main_rank) {
    progress_.update(rs_.epoch + 1, tc_.epochs, rs_.step_in_epoch, steps_per_epoch_, step.loss, step.lr, img_s,
                     epoch_eta, run_eta);
  }
  if (rs_.global_step % tc_.log_interval == 0 && main_rank) {
    const double interval_s = seconds_since(interval_start_);
    json line{{"step", rs_.global_step},  {"epoch", rs_.epoch + 1},
              {"loss", step.loss},        {"lr", step.lr},
              {"grad_norm", step.grad_norm}, {"img_per_s", interval_images_ / interval_s},
              {"time_s", rs_.elapsed_seconds + seconds_since(run_start_)}};
    if (scaler_.enabled()) line["loss_scale"] = scaler_.scale();
    if (env_.world_size > 1) line["comm_ms"] = 1000.0 * interval_comm_s_ * images_per_step_ / interval_images_;
    dir_->append_metrics(line);
    if (!progress_.tty()) {
      char text[240];
      std::snprintf(text, sizeof text,
                    "epoch %lld step %lld/%lld loss %.4f lr %.3e grad_norm %.3f %.0f img/s ETA epoch %s, run %s",
                    static_cast<long long>(rs_.epoch + 1), static_cast<long long>(rs_.step_in_epoch),
                    static_cast<long long>(steps_per_epoch_), step.loss, step.lr, step.grad_norm,
                    interval_images_ / interval_s, format_duration(epoch_eta).c_str(),
                    format_duration(run_eta).c_str());
      log::info(text);
    }
    interval_start_ = Clock::now();
    interval_images_ = 0;
    interval_comm_s_ = 0.0;
  }
  if (tc_.checkpoint_interval > 0 && rs_.global_step % tc_.checkpoint_interval == 0 &&
      rs_.step_in_epoch < steps_per_epoch_) {
    save_state();
  }
  if (step.stop) {
    save_state();
    progress_.end_line();
    throw TrainingInterrupted("stopped at step " + std::to_string(rs_.global_step) +
                              "; continue with: vit train --resume " + dir_->path());
  }
}

void Training::end_epoch() {
  if (dir_->writer()) progress_.end_line();
  EpochRecord record;
  record.epoch = rs_.epoch + 1;
  record.train_loss = rs_.epoch_loss_count ? rs_.epoch_loss_sum / rs_.epoch_loss_count : std::nan("");
  record.lr = last_lr_;
  record.epoch_seconds = rs_.epoch_seconds;
  record.img_per_s = rs_.epoch_seconds > 0 ? rs_.epoch_images / rs_.epoch_seconds : 0.0;
  record.eval_loss = record.eval_top1 = record.eval_top5 = std::nan("");
  const bool last_epoch = rs_.epoch + 1 == tc_.epochs || reached_max_;
  if ((rs_.epoch + 1) % tc_.eval_interval == 0 || last_epoch) {
    const EvalResult result = evaluate_weights(optimizer_->params());
    record.eval_loss = result.loss, record.eval_top1 = result.top1, record.eval_top5 = result.top5;
    last_top1_ = result.top1;
    std::string message = "epoch " + std::to_string(record.epoch) + ": train_loss " + csv_number(record.train_loss) +
                          ", eval_loss " + csv_number(result.loss) + ", top-1 " + csv_number(result.top1) +
                          "%, top-5 " + csv_number(result.top5) + "%, " +
                          std::to_string(static_cast<int64_t>(record.img_per_s)) + " img/s";
    bool best_is_ema = false;
    EvalResult ema_result;
    if (ema_.defined()) {
      ema_result = evaluate_weights(ema_);
      message += "; EMA top-1 " + csv_number(ema_result.top1) + "%";
      save_model_file("ema.safetensors", Weights::ema);
      best_is_ema = ema_result.top1 > result.top1;
    }
    log::info(message);
    if (tc_.final_weights == Weights::ema) last_top1_ = ema_result.top1;
    const double top1 = best_is_ema ? ema_result.top1 : result.top1;
    if (top1 > rs_.best_top1) {
      rs_.best_top1 = top1;
      model_metadata_["best_epoch"] = std::to_string(record.epoch);
      model_metadata_["best_top1"] = csv_number(top1);
      save_model_file("best.safetensors", best_is_ema ? Weights::ema : Weights::model);
    }
    if (tc_.target_top1 > 0 && rs_.seconds_to_target < 0 && top1 >= tc_.target_top1) {
      rs_.seconds_to_target = rs_.elapsed_seconds + seconds_since(run_start_);
      log::info("reached " + csv_number(tc_.target_top1) + "% top-1 after " + csv_number(rs_.seconds_to_target) +
                " s");
    }
  }
  model_metadata_.erase("best_epoch");
  model_metadata_.erase("best_top1");
  model_metadata_["epoch"] = std::to_string(record.epoch);
  save_model_file("last.safetensors", Weights::model);
  model_metadata_.erase("epoch");
  rs_.history.push_back(record);
  rs_.step_in_epoch = 0;
  rs_.epoch_loss_sum = 0.0;
  rs_.epoch_loss_count = 0;
  rs_.epoch_seconds = 0.0;
  rs_.epoch_images = 0;
  // The state says "epoch done" only after the model files exist, so a kill in between redoes the epoch end.
  ++rs_.epoch;
  save_state();
  dir_->write_summary(rs_.history);
  if (dir_->writer() && plot_curves_) plot_curves_(dir_->file("curves.png"), history_curves(rs_.history));
}

TrainResult Training::finish() {
  const auto bad = train_loader_->bad_images();
  if (!bad.empty()) {
    log::warn(std::to_string(bad.size()) + " bad images were skipped:");
    for (const auto& b : bad) log::warn("  " + b);
  }
  // The weights the config declared as its result before training started: the only ones to score on a test set.
  save_model_file("final.safetensors", tc_.final_weights);
  comm_->barrier();
  TrainResult result;
  result.run_dir = dir_->path();
  result.final_weights = tc_.final_weights;
  result.steps = rs_.global_step;
  result.best_top1 = rs_.best_top1;
  result.final_top1 =
      std::isfinite(last_top1_) ? last_top1_ : (rs_.history.empty() ? 0.0 : rs_.history.back().eval_top1);
  result.seconds = rs_.elapsed_seconds + seconds_since(run_start_);
  result.target_top1 = tc_.target_top1;
  result.seconds_to_target = rs_.seconds_to_target;
  result.history = rs_.history;
  return result;
}

}  // namespace

void request_stop() { stop_flag.store(true); }
bool stop_requested() { return stop_flag.load(); }

torch::Tensor rng_state() {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_rng_state(const torch::Tensor& state) {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state.to(torch::kUInt8));
}

torch::Tensor classification_loss(const torch::Tensor& logits, const torch::Tensor& labels,
                                  const torch::Tensor& soft_targets, double smoothing) {
  namespace F = torch::nn::functional;
  auto log_probs = logits.to(torch::kFloat32).log_softmax(-1);  // (B, K)
  if (soft_targets.defined()) return -(soft_targets * log_probs).sum(-1).mean();
  return F::nll_loss(log_probs, labels) * (1.0 - smoothing) - log_probs.mean(-1).mean() * smoothing;
}

TrainResult train(const TrainRequest& request, const TrainHooks& hooks) {
  Training run(request, hooks);  // config, device and ranks, data, model, optimiser, run directory, resume state
  while (run.epochs_left()) {
    run.start_epoch();
    while (run.steps_left_in_epoch()) run.after_step(run.step());
    run.end_epoch();
  }
  return run.finish();
}

}  // namespace vit
