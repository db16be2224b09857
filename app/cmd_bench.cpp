// `vit bench`: training and inference speed of a config's model on synthetic inputs (see bench/bench.h), or with
// --mode data the images/s of its training input pipeline (bench/data_bench.h).
#include <algorithm>
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "bench/bench.h"
#include "bench/data_bench.h"
#include "commands.h"
#include "common.h"
#include "vit/build_config.h"
#if VIT_WITH_OPENCV
#include "image/decode.h"
#include "image/randaugment.h"
#endif

namespace vit::app {
namespace {

struct BenchArgs {
  ConfigArgs config;
  std::string checkpoint;  // bench this model (file, snapshot or run folder) instead of the config's fresh one
  std::string precision;    // "" = the loaded model's own, else fp32
  std::string mode = "both";
  int64_t batch_size = 0;  // 0 = the config's train.batch_size
  int64_t steps = 20;
  int64_t warmup = 3;
  std::string device;      // "" = the config's train.device
  int threads = -1;        // -1 = the config's train.threads
  std::string amp;         // "" = the config's train.amp
  std::vector<int64_t> workers = {1, 2};  // --mode data: loader threads to measure
  int64_t batches = 0;     // --mode data: timed batches per measurement (0 = one epoch)
  bool json = false;
};

int run_data_bench_command(const BenchArgs& args, const Config& config) {
  DataBenchOptions options;
  options.workers = args.workers;
  options.batch_size = args.batch_size > 0 ? args.batch_size : config.train.batch_size;
  options.warmup_batches = std::max<int64_t>(args.warmup, 1);
  options.max_batches = args.batches;
  std::shared_ptr<const ImageCodec> codec;
  RawAugment randaugment;
#if VIT_WITH_OPENCV
  codec = image_codec();
  const AugmentConfig& augment = config.data.augment;
  if (augment.randaugment_ops > 0) randaugment = make_randaugment(augment.randaugment_ops, augment.randaugment_magnitude);
#endif
  const std::vector<DataBenchRow> rows = run_data_bench(config, codec, options, randaugment);
  for (const DataBenchRow& row : rows) {
    if (args.json) {
      std::cout << to_json(row).dump() << "\n";
    } else {
      std::printf("data  workers %-2lld %8.1f img/s  (%lld images in %.2f s, batch %lld)\n",
                  static_cast<long long>(row.workers), row.img_per_s, static_cast<long long>(row.images), row.seconds,
                  static_cast<long long>(options.batch_size));
    }
  }
  return kOk;
}

// "12.3" or "-" for a measurement that did not run.
std::string figure(double value, const char* format = "%.2f") {
  if (value < 0) return "-";
  char text[64];
  std::snprintf(text, sizeof(text), format, value);
  return text;
}

int run_bench_command(const BenchArgs& args) {
  auto config = load_config_args(args.config);
  if (args.mode == "data") {
    if (!config) throw std::invalid_argument("vit bench --mode data needs --config FILE (its data section is benched)");
    return run_data_bench_command(args, *config);
  }
  std::optional<LoadedModel> loaded;
  if (!args.checkpoint.empty()) {
    loaded = load_model_args(args.checkpoint, args.config);
    if (!config) config = Config{};  // the train section's defaults: device, threads, batch size, seed
    config->model = loaded->net->config();
  }
  if (!config) {
    throw std::invalid_argument("vit bench needs --config FILE (the model section is benched) or --checkpoint MODEL");
  }
  BenchOptions options;
  options.mode = args.mode;
  options.batch_size = args.batch_size > 0 ? args.batch_size : config->train.batch_size;
  options.steps = args.steps;
  options.warmup = args.warmup;
  options.device = args.device.empty() ? config->train.device : args.device;
  options.threads = args.threads >= 0 ? args.threads : static_cast<int>(config->train.threads);
  options.amp = args.amp.empty() ? config->train.amp : *enum_from_name<AmpMode>(args.amp);
  options.seed = config->train.seed;
  options.precision = loaded ? chosen_precision(*loaded, args.precision, resolve_device(options.device).type())
                             : args.precision.empty() ? Precision::fp32 : *enum_from_name<Precision>(args.precision);
  const auto r = loaded ? run_bench(loaded->net, options) : run_bench(config->model, options);
  if (args.json) {
    std::cout << to_json(r).dump() << "\n";
    return kOk;
  }
  std::printf("device          %s, %d threads, amp %s, batch %lld, %.3f GMACs/image\n", r.device.c_str(), r.threads,
              name_of(r.amp), static_cast<long long>(r.batch_size), r.gmacs);
  if (r.weight_mb >= 0) {
    std::printf("inference       %s, weights %s MiB\n", name_of(r.precision), figure(r.weight_mb, "%.1f").c_str());
  }
  if (r.train_img_per_s >= 0) {
    std::printf("train           %s img/s, step p50 %s ms, p95 %s ms, %s GFLOP/s\n",
                figure(r.train_img_per_s).c_str(), figure(r.step_ms_p50).c_str(), figure(r.step_ms_p95).c_str(),
                figure(r.train_gflops, "%.1f").c_str());
  }
  if (r.infer_img_per_s >= 0) {
    std::printf("infer batch 1   p50 %s ms, p95 %s ms\n", figure(r.latency_ms_p50).c_str(),
                figure(r.latency_ms_p95).c_str());
    std::printf("infer batch %-3lld p50 %s ms, p95 %s ms, %s img/s, %s GFLOP/s\n", static_cast<long long>(r.batch_size),
                figure(r.batch_latency_ms_p50).c_str(), figure(r.batch_latency_ms_p95).c_str(),
                figure(r.infer_img_per_s).c_str(), figure(r.infer_gflops, "%.1f").c_str());
  }
  if (r.peak_gflops > 0) {
    const auto blas = r.torch_blas.empty() ? std::string() : ", " + r.torch_blas;
    std::printf("matmul peak     %s GFLOP/s torch::mm (%s%s); achieved %s of it\n",
                figure(r.peak_gflops, "%.1f").c_str(), r.peak_dtype.c_str(), blas.c_str(),
                figure(100.0 * r.gflops() / r.peak_gflops, "%.1f%%").c_str());
  }
  if (r.kernel_peak_gflops > 0) {
    std::printf("                %s GFLOP/s through the model's linear (oneDNN); achieved %s of it\n",
                figure(r.kernel_peak_gflops, "%.1f").c_str(), figure(100.0 * r.kernel_peak_fraction(), "%.1f%%").c_str());
  }
  std::printf("peak memory     %s MiB resident", figure(r.peak_rss_mb, "%.0f").c_str());
  if (r.peak_cuda_mb >= 0) std::printf(", %s MiB CUDA", figure(r.peak_cuda_mb, "%.0f").c_str());
  std::printf("\n");
  return kOk;
}

}  // namespace

void setup_bench(CLI::App& app, int& status) {
  auto args = std::make_shared<BenchArgs>();
  auto* command = app.add_subcommand("bench", "Time training and inference of a config's model on synthetic inputs");
  add_config_args(command, args->config);
  command->add_option("--checkpoint", args->checkpoint,
                      "bench this model (file, timm / Hugging Face snapshot or run folder) as it loads, instead of "
                      "the config's model with fresh weights")
      ->check(CLI::ExistingPath);
  add_precision_option(command, args->precision);
  command->add_option("--mode", args->mode, "what to time: train | infer | both | data (the training input pipeline)")
      ->check(CLI::IsMember({"train", "infer", "both", "data"}))
      ->capture_default_str();
  command->add_option("--batch-size", args->batch_size, "training batch and second inference batch "
                                                        "(default: the config's train.batch_size)")
      ->check(CLI::PositiveNumber);
  command->add_option("--steps", args->steps, "timed iterations per measurement")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->add_option("--warmup", args->warmup, "untimed iterations before each measurement")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command->add_option("--device", args->device, "auto | cpu | cuda | cuda:N (default: the config's train.device)");
  command->add_option("--threads", args->threads, "CPU threads, 0 = all cores (default: the config's train.threads)")
      ->check(CLI::NonNegativeNumber);
  command
      ->add_option(
          "--amp", args->amp,
          "off | bf16 | fp16 (CUDA) | auto (bf16 on CUDA and on a CPU with AMX, else float32); on the CPU bf16 needs "
          "AVX512_BF16 or AMX (default: the config's train.amp)")
      ->check(enum_choice<AmpMode>());
  command->add_option("--workers", args->workers, "--mode data: loader worker counts to measure, e.g. 1,2")
      ->delimiter(',')
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command->add_option("--batches", args->batches, "--mode data: timed batches per measurement (0 = one epoch)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command->add_flag("--json", args->json, "print one JSON object (--mode data: one per worker count)");
  command->callback([args, &status] { status = run_bench_command(*args); });
}

}  // namespace vit::app
