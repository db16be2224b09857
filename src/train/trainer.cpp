// The training loop and its run directory. Everything that decides the next update (weights, AdamW moments, step,
// schedule position, data order position, RNG, EMA) is saved in state.safetensors, so --resume continues bit-exactly.
#include "train/trainer.h"

#include <torch/version.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include <nlohmann/json.hpp>

#include "data/loader.h"
#include "io/model_file.h"
#include "io/safetensors.h"
#include "train/amp.h"
#include "train/distributed.h"
#include "train/evaluate.h"
#include "train/schedule.h"
#include "util/fs.h"
#include "util/log.h"
#include "util/runtime.h"

namespace vit {
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::atomic<bool> stop_flag{false};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char text[32];
  std::strftime(text, sizeof text, "%Y%m%d-%H%M%S", &local);
  return text;
}

// Progress of the run that is not in the tensors: saved as JSON in the state file's metadata.
struct RunState {
  int64_t epoch = 0;          // current epoch, 0-based
  int64_t step_in_epoch = 0;  // optimiser steps done in the current epoch
  int64_t global_step = 0;    // optimiser steps done in all
  double epoch_loss_sum = 0.0;
  int64_t epoch_loss_count = 0;
  double epoch_seconds = 0.0;
  int64_t epoch_images = 0;
  double best_top1 = -1.0;
  double elapsed_seconds = 0.0;  // wall time of the run before this process
  double seconds_to_90 = -1.0;
  uint64_t metrics_bytes = 0;    // metrics.jsonl is cut back to this length on resume
  double loss_scale = 65536.0;   // fp16 dynamic loss scale
  int64_t good_steps = 0;        // fp16 steps since the scale last changed
  std::vector<EpochRecord> history;
};

json record_json(const EpochRecord& r) {
  return {{"epoch", r.epoch},         {"train_loss", r.train_loss}, {"eval_loss", r.eval_loss},
          {"eval_top1", r.eval_top1}, {"eval_top5", r.eval_top5},   {"lr", r.lr},
          {"epoch_seconds", r.epoch_seconds}, {"img_per_s", r.img_per_s}};
}

double number_or_nan(const json& j, const char* key) {
  const auto& v = j.at(key);
  return v.is_number() ? v.get<double>() : std::nan("");
}

EpochRecord record_from_json(const json& j) {
  EpochRecord r;
  r.epoch = j.at("epoch").get<int64_t>();
  r.train_loss = number_or_nan(j, "train_loss");
  r.eval_loss = number_or_nan(j, "eval_loss");
  r.eval_top1 = number_or_nan(j, "eval_top1");
  r.eval_top5 = number_or_nan(j, "eval_top5");
  r.lr = number_or_nan(j, "lr");
  r.epoch_seconds = number_or_nan(j, "epoch_seconds");
  r.img_per_s = number_or_nan(j, "img_per_s");
  return r;
}

json state_json(const RunState& s) {
  json history = json::array();
  for (const auto& r : s.history) history.push_back(record_json(r));
  return {{"epoch", s.epoch},
          {"step_in_epoch", s.step_in_epoch},
          {"global_step", s.global_step},
          {"epoch_loss_sum", s.epoch_loss_sum},
          {"epoch_loss_count", s.epoch_loss_count},
          {"epoch_seconds", s.epoch_seconds},
          {"epoch_images", s.epoch_images},
          {"best_top1", s.best_top1},
          {"elapsed_seconds", s.elapsed_seconds},
          {"seconds_to_90", s.seconds_to_90},
          {"metrics_bytes", s.metrics_bytes},
          {"loss_scale", s.loss_scale},
          {"good_steps", s.good_steps},
          {"history", history}};
}

RunState state_from_json(const json& j) {
  RunState s;
  s.epoch = j.at("epoch").get<int64_t>();
  s.step_in_epoch = j.at("step_in_epoch").get<int64_t>();
  s.global_step = j.at("global_step").get<int64_t>();
  s.epoch_loss_sum = j.at("epoch_loss_sum").get<double>();
  s.epoch_loss_count = j.at("epoch_loss_count").get<int64_t>();
  s.epoch_seconds = j.at("epoch_seconds").get<double>();
  s.epoch_images = j.at("epoch_images").get<int64_t>();
  s.best_top1 = j.at("best_top1").get<double>();
  s.elapsed_seconds = j.at("elapsed_seconds").get<double>();
  s.seconds_to_90 = j.at("seconds_to_90").get<double>();
  s.metrics_bytes = j.at("metrics_bytes").get<uint64_t>();
  s.loss_scale = j.at("loss_scale").get<double>();
  s.good_steps = j.at("good_steps").get<int64_t>();
  for (const auto& r : j.at("history")) s.history.push_back(record_from_json(r));
  return s;
}

std::string csv_number(double v) {
  if (!std::isfinite(v)) return "";
  std::ostringstream s;
  s << std::setprecision(8) << v;
  return s.str();
}

void write_summary_csv(const std::string& path, const std::vector<EpochRecord>& history) {
  std::string text = "epoch,train_loss,eval_loss,eval_top1,eval_top5,lr,epoch_seconds,img_per_s\n";
  for (const auto& r : history) {
    text += std::to_string(r.epoch) + "," + csv_number(r.train_loss) + "," + csv_number(r.eval_loss) + "," +
            csv_number(r.eval_top1) + "," + csv_number(r.eval_top5) + "," + csv_number(r.lr) + "," +
            csv_number(r.epoch_seconds) + "," + csv_number(r.img_per_s) + "\n";
  }
  write_file_atomic(path, text);
}

// <root>/latest -> the run directory, replaced atomically (a temporary link renamed over the old one).
void point_latest(const std::string& output_root, const std::string& run_dir) {
  std::error_code error;
  fs::create_directories(output_root, error);
  fs::path target = fs::absolute(run_dir, error);
  const fs::path root = fs::absolute(output_root, error);
  if (target.parent_path() == root) target = target.filename();  // relative: the runs folder can move
  const fs::path link = root / "latest";
  const fs::path temporary = root / (".latest.tmp." + std::to_string(::getpid()));
  fs::remove(temporary, error);
  fs::create_directory_symlink(target, temporary, error);
  if (!error) fs::rename(temporary, link, error);
  if (error) log::warn("could not point " + link.string() + " at " + run_dir + ": " + error.message());
}

class Progress {
 public:
  Progress() : tty_(::isatty(::fileno(stderr)) != 0) {}
  bool tty() const { return tty_; }
  void update(int64_t epoch, int64_t epochs, int64_t step, int64_t steps, double loss, double lr, double img_s,
              double eta_s) {
    if (!tty_) return;
    const int width = 24;
    const int filled = steps > 0 ? static_cast<int>(width * step / steps) : 0;
    std::string bar(filled, '=');
    if (filled < width) bar += '>' + std::string(width - filled - 1, ' ');
    std::fprintf(stderr, "\r\033[Kepoch %lld/%lld [%s] %lld/%lld loss %.4f lr %.2e %.0f img/s ETA %d:%02d",
                 static_cast<long long>(epoch), static_cast<long long>(epochs), bar.c_str(),
                 static_cast<long long>(step), static_cast<long long>(steps), loss, lr, img_s,
                 static_cast<int>(eta_s) / 60, static_cast<int>(eta_s) % 60);
    std::fflush(stderr);
  }
  void end_line() {
    if (tty_) std::fprintf(stderr, "\n");
  }

 private:
  bool tty_;
};

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
  const auto run_start = Clock::now();
  Config config = request.config;
  auto& tc = config.train;
  const bool resuming = !request.resume_dir.empty();
  if (resuming) {
    config = load_config(request.resume_dir + "/config.json");
    log::info("resuming " + request.resume_dir + " with its own config.json");
  }

  const DistEnv env = dist_env_from_environment();
  configure_threads(static_cast<int>(tc.threads));
  torch::Device device = resolve_device(tc.device);
  if (device.is_cuda() && env.world_size > 1) device = torch::Device(torch::kCUDA, env.local_rank);
  auto comm = make_communicator(env, tc, device);
  const bool main_rank = comm->is_main();
  if (env.world_size > 1) log::set_prefix("[rank " + std::to_string(env.rank) + "] ");
  if (tc.amp != "off" && !device.is_cuda()) {
    log::warn("train.amp=" + tc.amp + " needs CUDA; training in float32 on " + device.str());
  }
  const bool amp = tc.amp != "off" && device.is_cuda();
  const bool fp16 = amp && tc.amp == "fp16";

  // ---- data ----
  const Splits splits = open_datasets(config.data, tc.seed, hooks.decoder);
  const auto& class_names = splits.train->class_names();
  const auto num_classes = static_cast<int64_t>(class_names.size());
  if (config.model.num_classes != num_classes) {
    log::info("model.num_classes " + std::to_string(config.model.num_classes) + " -> " +
              std::to_string(num_classes) + " (the dataset's classes)");
    config.model.num_classes = num_classes;
  }
  RawAugment raw_augment;
  if (config.data.augment.randaugment_ops > 0) {
    if (!hooks.make_randaugment) throw std::invalid_argument("data.augment.randaugment_ops needs a build with OpenCV");
    raw_augment = hooks.make_randaugment(config.data.augment.randaugment_ops, config.data.augment.randaugment_magnitude);
  }
  LoaderOptions train_options;
  train_options.batch_size = tc.batch_size;
  train_options.shuffle = true;
  train_options.drop_last = true;
  train_options.seed = tc.seed;
  train_options.num_workers = config.data.num_workers;
  train_options.prefetch = config.data.prefetch_batches;
  train_options.rank = env.rank;
  train_options.world_size = env.world_size;
  train_options.skip_bad_images = config.data.on_bad_image == "skip";
  train_options.pin_memory = device.is_cuda();
  Loader train_loader(splits.train, make_train_transform(config.data, config.model, raw_augment), train_options,
                      make_mix_transform(config.data.augment, num_classes, tc.label_smoothing));
  LoaderOptions eval_options = train_options;
  eval_options.shuffle = false;
  eval_options.drop_last = false;
  Loader eval_loader(splits.val, make_eval_transform(config.data, config.model), eval_options);

  const int64_t steps_per_epoch = train_loader.batches_per_epoch() / tc.accum_steps;
  if (steps_per_epoch < 1) {
    throw std::invalid_argument("train.batch_size " + std::to_string(tc.batch_size) + " x accum_steps " +
                                std::to_string(tc.accum_steps) + " x ranks " + std::to_string(env.world_size) +
                                " is larger than the training set (" + std::to_string(splits.train->size()) +
                                " samples)");
  }
  const Schedule schedule = make_schedule(tc, steps_per_epoch);

  // ---- model and optimiser ----
  torch::manual_seed(tc.seed);
  VisionTransformer net(config.model);
  if (!request.init_from.empty() && !resuming) {
    for (const auto& note : load_for_finetune(request.init_from, net)) log::info(request.init_from + ": " + note);
  }
  net->to(device);
  std::vector<std::pair<std::string, torch::Tensor>> named_parameters;
  for (const auto& item : net->named_parameters()) named_parameters.emplace_back(item.key(), item.value());
  FlatAdamW optimizer(named_parameters, tc);
  // Averages gradients over ranks, each bucket's all-reduce overlapping the rest of backward (no-op for one rank).
  GradientReducer reducer(*comm, optimizer.grads(), optimizer.named(), named_parameters);
  {
    std::vector<torch::Tensor> params{optimizer.params()};
    comm->broadcast(params, 0);  // identical start on every rank
  }
  torch::Tensor ema;  // flat EMA of the parameters
  if (tc.ema_decay > 0) ema = optimizer.params().detach().clone();
  torch::manual_seed(mix_seed({tc.seed, 0x64726f70ULL, static_cast<uint64_t>(env.rank)}));  // dropout stream

  // ---- run directory ----
  std::string run_dir = resuming ? request.resume_dir : request.out_dir;
  if (run_dir.empty()) run_dir = tc.output_root + "/" + request.config_name + "-" + timestamp();
  RunState rs;
  if (resuming) {
    const std::string state_path = run_dir + "/state.safetensors";
    const auto archive = safetensors::read(state_path);
    auto tensor = [&](const std::string& name) {
      const auto* info = archive.find(name);
      if (info == nullptr) throw std::runtime_error(state_path + ": missing tensor " + name);
      return archive.tensor(*info, /*as_float32=*/false);
    };
    torch::NoGradGuard no_grad;
    auto params = tensor("params");
    if (params.numel() != optimizer.params().numel()) {
      throw std::runtime_error(state_path + ": " + std::to_string(params.numel()) + " parameters saved, the model has " +
                               std::to_string(optimizer.params().numel()));
    }
    optimizer.params().copy_(params);
    optimizer.load_state({{"optimizer.exp_avg", tensor("optimizer.exp_avg")},
                          {"optimizer.exp_avg_sq", tensor("optimizer.exp_avg_sq")},
                          {"optimizer.steps", tensor("optimizer.steps")}});
    if (ema.defined()) ema.copy_(tensor("ema"));
    // The position in the epoch counts per-rank batches and each rank has its own RNG stream: same world size only.
    const auto saved_world = archive.metadata.find("world_size");
    const int world_size = saved_world == archive.metadata.end() ? 1 : std::stoi(saved_world->second);
    if (world_size != env.world_size) {
      throw std::invalid_argument(state_path + " was saved by " + std::to_string(world_size) + " rank(s); resume it " +
                                  "with WORLD_SIZE=" + std::to_string(world_size) + ", not " +
                                  std::to_string(env.world_size));
    }
    set_rng_state(tensor("rng.cpu.rank" + std::to_string(env.rank)));
    auto meta = archive.metadata.find("state");
    if (meta == archive.metadata.end()) throw std::runtime_error(state_path + ": no \"state\" metadata");
    rs = state_from_json(json::parse(meta->second));
    log::info("resumed at epoch " + std::to_string(rs.epoch + 1) + ", step " + std::to_string(rs.global_step));
  }
  const std::string metrics_path = run_dir + "/metrics.jsonl";
  if (main_rank) {
    make_dirs(run_dir);
    write_file_atomic(run_dir + "/config.json", to_json(config).dump(2) + "\n");
    if (resuming) {
      std::error_code error;
      if (fs::exists(metrics_path, error)) fs::resize_file(metrics_path, rs.metrics_bytes, error);
    } else {
      write_file_atomic(metrics_path, "");
    }
    point_latest(tc.output_root, run_dir);
    log::info("run directory: " + run_dir);
  }
  std::ofstream metrics;
  if (main_rank) metrics.open(metrics_path, std::ios::app);

  std::map<std::string, std::string> model_metadata{{"class_source", config.data.format}};
  auto save_state = [&] {
    std::vector<std::pair<std::string, torch::Tensor>> tensors{{"params", optimizer.params().detach().cpu()}};
    for (auto& [name, t] : optimizer.state()) tensors.emplace_back(name, t.cpu());
    if (ema.defined()) tensors.emplace_back("ema", ema.cpu());
    // Every rank's dropout stream; each rank restores its own.
    std::vector<torch::Tensor> states{rng_state()};
    if (env.world_size > 1) {
      auto all = torch::zeros({env.world_size, states[0].numel()}, torch::kUInt8).to(torch::kFloat64);
      all[env.rank].copy_(states[0].to(torch::kFloat64));
      std::vector<torch::Tensor> gathered{all};
      comm->all_reduce_sum(gathered);
      for (int r = 0; r < env.world_size; ++r) {
        tensors.emplace_back("rng.cpu.rank" + std::to_string(r), gathered[0][r].to(torch::kUInt8).contiguous());
      }
    } else {
      tensors.emplace_back("rng.cpu.rank0", states[0]);
    }
    if (!main_rank) return;
    if (metrics.is_open()) metrics.flush();
    std::error_code error;
    rs.metrics_bytes = fs::exists(metrics_path, error) ? fs::file_size(metrics_path, error) : 0;
    const double elapsed_before = rs.elapsed_seconds;
    rs.elapsed_seconds = elapsed_before + seconds_since(run_start);
    safetensors::write(run_dir + "/state.safetensors", tensors,
                       {{"format", "vit-train-state"}, {"format_version", "1"}, {"state", state_json(rs).dump()},
                        {"world_size", std::to_string(env.world_size)}});
    rs.elapsed_seconds = elapsed_before;
  };
  // Writes a model file from a flat parameter buffer (the live weights or the EMA).
  auto save_flat_model = [&](const std::string& path, const torch::Tensor& flat) {
    if (!main_rank) return;
    torch::NoGradGuard no_grad;
    if (flat.data_ptr() == optimizer.params().data_ptr()) {
      save_model(path, net, config.data.preprocess, class_names, model_metadata);
      return;
    }
    auto backup = optimizer.params().clone();
    optimizer.params().copy_(flat);
    save_model(path, net, config.data.preprocess, class_names, model_metadata);
    optimizer.params().copy_(backup);
  };
  auto evaluate_flat = [&](const torch::Tensor& flat) {
    torch::NoGradGuard no_grad;
    if (flat.data_ptr() == optimizer.params().data_ptr()) {
      return evaluate(net, eval_loader, num_classes, device, comm.get());
    }
    auto backup = optimizer.params().clone();
    optimizer.params().copy_(flat);
    auto result = evaluate(net, eval_loader, num_classes, device, comm.get());
    optimizer.params().copy_(backup);
    return result;
  };

  log::info("training " + std::to_string(count_parameters(*net)) + " parameters on " + device.str() + " for " +
            std::to_string(tc.epochs) + " epochs x " + std::to_string(steps_per_epoch) + " steps (batch " +
            std::to_string(tc.batch_size) + " x accum " + std::to_string(tc.accum_steps) + " x ranks " +
            std::to_string(env.world_size) + "), " + std::to_string(splits.train->size()) + " train / " +
            std::to_string(splits.val->size()) + " val samples");

  Progress progress;
  const int64_t images_per_step = tc.batch_size * tc.accum_steps * env.world_size;
  bool reached_max = tc.max_steps > 0 && rs.global_step >= tc.max_steps;
  double last_top1 = std::nan("");
  net->train();
  for (; rs.epoch < tc.epochs && !reached_max; ++rs.epoch) {
    train_loader.start_epoch(rs.epoch, rs.step_in_epoch * tc.accum_steps);
    auto interval_start = Clock::now();
    int64_t interval_images = 0;
    double interval_comm_s = 0.0;  // waiting for the gradient all-reduce after backward (what overlap left over)
    double last_lr = schedule.lr_at(rs.global_step);
    while (rs.step_in_epoch < steps_per_epoch) {
      if (tc.max_steps > 0 && rs.global_step >= tc.max_steps) {
        reached_max = true;
        break;
      }
      const auto step_start = Clock::now();
      optimizer.zero_grad();
      double step_loss = 0.0;
      double bad_loss = 0.0;  // this rank's first non-finite loss of the step (0 = none)
      for (int64_t micro = 0; micro < tc.accum_steps; ++micro) {
        auto batch = train_loader.next();
        if (!batch) throw std::runtime_error("data loader ended early in epoch " + std::to_string(rs.epoch + 1));
        auto images = batch->images.to(device, /*non_blocking=*/true);
        auto labels = batch->labels.to(device, /*non_blocking=*/true);
        auto soft = batch->soft_targets.defined() ? batch->soft_targets.to(device, true) : torch::Tensor();
        torch::Tensor loss;
        {
          AutocastScope autocast(amp, fp16 ? at::kHalf : at::kBFloat16);
          loss = classification_loss(net->forward(images), labels, soft, tc.label_smoothing);
        }
        const double value = loss.item<double>();
        if (!std::isfinite(value) && bad_loss == 0.0) bad_loss = value;
        if (bad_loss != 0.0 && env.world_size == 1) break;
        step_loss += value / static_cast<double>(tc.accum_steps);
        if (micro + 1 == tc.accum_steps) reducer.arm();  // this backward completes the step's gradients
        (loss * ((fp16 ? rs.loss_scale : 1.0) / static_cast<double>(tc.accum_steps))).backward();
      }
      const auto comm_start = Clock::now();
      reducer.finish();
      interval_comm_s += seconds_since(comm_start);
      // One small all-reduce: the loss over all ranks (what one process with the global batch would log), and
      // whether any rank was asked to stop (a signal may reach one rank only), so that all stop after this step.
      // A rank whose loss is not finite still ran its backward (its peers' all-reduce needs its gradients), and says
      // so here: every rank then stops with the cause, not only the rank that saw it.
      const auto shared = sum_over_ranks(
          *comm, {step_loss, stop_requested() ? 1.0 : 0.0, bad_loss != 0.0 ? 1.0 : 0.0});
      step_loss = shared[0] / env.world_size;
      const bool stop_now = shared[1] > 0.0;
      if (shared[2] > 0.0) {
        std::string where;
        if (env.world_size > 1) {
          where = " on " + std::to_string(static_cast<int64_t>(shared[2])) + " of " +
                  std::to_string(env.world_size) + " ranks" + (bad_loss != 0.0 ? " (this one included)" : "");
        }
        throw std::runtime_error("training diverged: loss is " + std::to_string(bad_loss != 0.0 ? bad_loss : step_loss) +
                                 " at step " + std::to_string(rs.global_step + 1) + " (epoch " +
                                 std::to_string(rs.epoch + 1) + ")" + where + "; the last good checkpoint in " +
                                 run_dir + " is untouched (try a lower train.lr or train.clip_grad)");
      }
      if (fp16) optimizer.grads().div_(rs.loss_scale);
      const double grad_norm = optimizer.clip_grad_norm(tc.clip_grad);
      const double lr = schedule.lr_at(rs.global_step);
      if (!std::isfinite(grad_norm)) {
        if (!fp16) {
          throw std::runtime_error("training diverged: gradient norm is " + std::to_string(grad_norm) +
                                   " at step " + std::to_string(rs.global_step + 1) + "; the last good checkpoint in " +
                                   run_dir + " is untouched");
        }
        rs.loss_scale /= 2.0;  // fp16 overflow: skip this update, retry with a smaller scale
        rs.good_steps = 0;
      } else {
        optimizer.step(lr);
        if (fp16 && ++rs.good_steps % 2000 == 0) rs.loss_scale *= 2.0;
        if (ema.defined()) {
          torch::NoGradGuard no_grad;
          ema.mul_(tc.ema_decay).add_(optimizer.params(), 1.0 - tc.ema_decay);
        }
      }
      last_lr = lr;
      ++rs.global_step;
      ++rs.step_in_epoch;
      rs.epoch_loss_sum += step_loss;
      ++rs.epoch_loss_count;
      rs.epoch_images += images_per_step;
      interval_images += images_per_step;
      rs.epoch_seconds += seconds_since(step_start);

      const double img_s = rs.epoch_seconds > 0 ? rs.epoch_images / rs.epoch_seconds : 0.0;
      const double eta = img_s > 0 ? (steps_per_epoch - rs.step_in_epoch) * images_per_step / img_s : 0.0;
      if (main_rank) {
        progress.update(rs.epoch + 1, tc.epochs, rs.step_in_epoch, steps_per_epoch, step_loss, lr, img_s, eta);
      }
      if (rs.global_step % tc.log_interval == 0 && main_rank) {
        const double interval_s = seconds_since(interval_start);
        json line{{"step", rs.global_step},   {"epoch", rs.epoch + 1},     {"loss", step_loss},
                  {"lr", lr},                 {"grad_norm", grad_norm},    {"img_per_s", interval_images / interval_s},
                  {"time_s", rs.elapsed_seconds + seconds_since(run_start)}};
        if (fp16) line["loss_scale"] = rs.loss_scale;
        if (env.world_size > 1) line["comm_ms"] = 1000.0 * interval_comm_s * images_per_step / interval_images;
        metrics << line.dump() << "\n";
        metrics.flush();
        if (!progress.tty()) {
          char text[200];
          std::snprintf(text, sizeof text, "epoch %lld step %lld/%lld loss %.4f lr %.3e grad_norm %.3f %.0f img/s",
                        static_cast<long long>(rs.epoch + 1), static_cast<long long>(rs.step_in_epoch),
                        static_cast<long long>(steps_per_epoch), step_loss, lr, grad_norm,
                        interval_images / interval_s);
          log::info(text);
        }
        interval_start = Clock::now();
        interval_images = 0;
        interval_comm_s = 0.0;
      }
      if (tc.checkpoint_interval > 0 && rs.global_step % tc.checkpoint_interval == 0 &&
          rs.step_in_epoch < steps_per_epoch) {
        save_state();
      }
      if (stop_now) {
        save_state();
        progress.end_line();
        throw TrainingInterrupted("stopped at step " + std::to_string(rs.global_step) +
                                  "; continue with: vit train --resume " + run_dir);
      }
    }
    if (main_rank) progress.end_line();

    // ---- end of epoch: evaluate, record, save ----
    EpochRecord record;
    record.epoch = rs.epoch + 1;
    record.train_loss = rs.epoch_loss_count ? rs.epoch_loss_sum / rs.epoch_loss_count : std::nan("");
    record.lr = last_lr;
    record.epoch_seconds = rs.epoch_seconds;
    record.img_per_s = rs.epoch_seconds > 0 ? rs.epoch_images / rs.epoch_seconds : 0.0;
    record.eval_loss = record.eval_top1 = record.eval_top5 = std::nan("");
    const bool last_epoch = rs.epoch + 1 == tc.epochs || reached_max;
    if ((rs.epoch + 1) % tc.eval_interval == 0 || last_epoch) {
      auto result = evaluate_flat(optimizer.params());
      record.eval_loss = result.loss, record.eval_top1 = result.top1, record.eval_top5 = result.top5;
      last_top1 = result.top1;
      std::string message = "epoch " + std::to_string(record.epoch) + ": train_loss " +
                            csv_number(record.train_loss) + ", eval_loss " + csv_number(result.loss) + ", top-1 " +
                            csv_number(result.top1) + "%, top-5 " + csv_number(result.top5) + "%, " +
                            std::to_string(static_cast<int64_t>(record.img_per_s)) + " img/s";
      bool best_is_ema = false;
      EvalResult ema_result;
      if (ema.defined()) {
        ema_result = evaluate_flat(ema);
        message += "; EMA top-1 " + csv_number(ema_result.top1) + "%";
        save_flat_model(run_dir + "/ema.safetensors", ema);
        best_is_ema = ema_result.top1 > result.top1;
      }
      log::info(message);
      const double top1 = best_is_ema ? ema_result.top1 : result.top1;
      if (top1 > rs.best_top1) {
        rs.best_top1 = top1;
        model_metadata["best_epoch"] = std::to_string(record.epoch);
        model_metadata["best_top1"] = csv_number(top1);
        model_metadata["weights"] = best_is_ema ? "ema" : "model";
        save_flat_model(run_dir + "/best.safetensors", best_is_ema ? ema : optimizer.params());
      }
      if (rs.seconds_to_90 < 0 && top1 >= 90.0) {
        rs.seconds_to_90 = rs.elapsed_seconds + seconds_since(run_start);
        log::info("reached 90% top-1 after " + csv_number(rs.seconds_to_90) + " s");
      }
    }
    model_metadata.erase("best_epoch");
    model_metadata.erase("best_top1");
    model_metadata["weights"] = "model";
    model_metadata["epoch"] = std::to_string(record.epoch);
    save_flat_model(run_dir + "/last.safetensors", optimizer.params());
    model_metadata.erase("epoch");
    rs.history.push_back(record);
    rs.step_in_epoch = 0;
    rs.epoch_loss_sum = 0.0;
    rs.epoch_loss_count = 0;
    rs.epoch_seconds = 0.0;
    rs.epoch_images = 0;
    // The state says "epoch done" only after the model files exist, so a kill in between redoes the epoch end.
    const int64_t finished_epoch = rs.epoch;
    rs.epoch = finished_epoch + 1;
    save_state();
    rs.epoch = finished_epoch;
    if (main_rank) {
      write_summary_csv(run_dir + "/summary.csv", rs.history);
      if (hooks.plot_curves) hooks.plot_curves(run_dir + "/curves.png", rs.history);
    }
  }
  const auto bad = train_loader.bad_images();
  if (!bad.empty()) {
    log::warn(std::to_string(bad.size()) + " bad images were skipped:");
    for (const auto& b : bad) log::warn("  " + b);
  }
  comm->barrier();
  TrainResult result;
  result.run_dir = run_dir;
  result.steps = rs.global_step;
  result.best_top1 = rs.best_top1;
  result.final_top1 = std::isfinite(last_top1) ? last_top1 : (rs.history.empty() ? 0.0 : rs.history.back().eval_top1);
  result.seconds = rs.elapsed_seconds + seconds_since(run_start);
  result.seconds_to_90 = rs.seconds_to_90;
  result.history = rs.history;
  return result;
}

}  // namespace vit
