// The bench (src/bench/bench.h, `vit bench`): its statistics, every reported field on the CPU and on CUDA, bad
// options, the command's JSON; and the all-reduce cost per step of the shipped models, printed for the record.
// Timings are printed, never asserted: they depend on the machine and on what else runs on it.
#include <gtest/gtest.h>

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "bench/bench.h"
#include "config/config.h"
#include "model/vit.h"
#include "test_util.h"
#include "train/distributed.h"

namespace vit {
namespace {

using Clock = std::chrono::steady_clock;

ModelConfig small_model() {
  return test::tiny_vit(/*img=*/32, /*patch=*/8, /*in_chans=*/3, /*num_classes=*/10, /*embed_dim=*/64, /*depth=*/2,
                        /*num_heads=*/4, /*mlp_ratio=*/2.0);
}

// A few timed steps after `warmup` untimed ones, and `peak_seconds` measuring the matmul peak.
BenchOptions short_run(const std::string& device, int64_t batch_size, int64_t steps, int64_t warmup,
                       double peak_seconds) {
  BenchOptions options;
  options.device = device;
  options.batch_size = batch_size, options.steps = steps, options.warmup = warmup;
  options.peak_seconds = peak_seconds;
  return options;
}

TEST(Cuda, BenchRunsOnCuda) {
  SKIP_WITHOUT_CUDA();
  BenchOptions options = short_run("cuda", /*batch_size=*/8, /*steps=*/3, /*warmup=*/1, /*peak_seconds=*/0.1);
  options.amp = AmpMode::bf16;
  const auto result = run_bench(small_model(), options);
  EXPECT_EQ(result.device, "cuda:0");
  EXPECT_EQ(result.amp, AmpMode::bf16);
  EXPECT_GT(result.train_img_per_s, 0.0);
  EXPECT_GT(result.latency_ms_p50, 0.0);
  EXPECT_GT(result.peak_gflops, 0.0);
}

TEST(Bench, PercentileIsNearestRank) {
  EXPECT_DOUBLE_EQ(percentile({5, 1, 4, 2, 3}, 50), 3.0);
  EXPECT_DOUBLE_EQ(percentile({5, 1, 4, 2, 3}, 95), 5.0);
  EXPECT_DOUBLE_EQ(percentile({5, 1, 4, 2, 3}, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile({7}, 95), 7.0);
  EXPECT_TRUE(std::isnan(percentile({}, 50)));
}

TEST(Bench, RunsOnCpuAndReportsEveryField) {
  const auto result =
      run_bench(small_model(), short_run("cpu", /*batch_size=*/4, /*steps=*/3, /*warmup=*/1, /*peak_seconds=*/0.05));
  EXPECT_EQ(result.device, "cpu");
  EXPECT_GT(result.train_img_per_s, 0.0);
  EXPECT_LE(result.step_ms_p50, result.step_ms_p95);
  EXPECT_LE(result.latency_ms_p50, result.latency_ms_p95);
  EXPECT_GT(result.batch_latency_ms_p50, 0.0);
  EXPECT_GT(result.peak_gflops, 0.0);
  EXPECT_GT(result.peak_fraction(), 0.0);
  EXPECT_DOUBLE_EQ(result.peak_fraction(),
                   result.gflops() / std::max(result.peak_gflops, result.kernel_peak_gflops));  // the faster product's
  std::cout << "torch::mm " << result.peak_gflops << " GFLOP/s ('" << result.torch_blas << "'), the model's linear "
            << result.kernel_peak_gflops << " GFLOP/s\n";
  EXPECT_GT(result.peak_rss_mb, 0.0);
  EXPECT_LT(result.peak_cuda_mb, 0.0);  // not measured on CPU
  // Training FLOPs are 3x the forward's: 6 x MACs per image.
  EXPECT_NEAR(result.train_gflops, 6.0 * result.gmacs * result.train_img_per_s, 1e-6 * result.train_gflops);
  const auto json = to_json(result);
  for (const char* key : {"img_per_s", "step_ms_p50", "step_ms_p95", "latency_ms_p50", "latency_ms_p95", "peak_rss_mb",
                          "gflops", "peak_fraction"}) {
    ASSERT_TRUE(json.contains(key)) << key;
    EXPECT_TRUE(json[key].is_number()) << key << " = " << json[key].dump();
  }
  EXPECT_TRUE(json["peak_cuda_mb"].is_null());
  // PyTorch's wheels run torch::mm through MKL even where OpenBLAS is loaded beside it (OpenCV, Debian's libdnnl).
  const bool mkl = dlsym(RTLD_DEFAULT, "mkl_blas_sgemm") != nullptr;
  EXPECT_EQ(result.torch_blas == "MKL", mkl) << result.torch_blas;
  EXPECT_TRUE(json["torch_blas"].is_null() || !json["torch_blas"].get<std::string>().empty());
}

// The achieved fraction is of the faster of the two products measured: Debian's LibTorch's torch::mm is OpenBLAS's,
// which runs generic SSE3 kernels on CPUs newer than its release, and a fraction of that reads above 1.
TEST(Bench, PeakFractionIsOfTheFasterProduct) {
  BenchResult r;
  r.train_gflops = 100.0;
  r.peak_gflops = 50.0;
  r.kernel_peak_gflops = 200.0;
  EXPECT_DOUBLE_EQ(r.peak_fraction(), 0.5);
  EXPECT_DOUBLE_EQ(r.kernel_peak_fraction(), 0.5);
  EXPECT_DOUBLE_EQ(to_json(r)["best_peak_gflops"].get<double>(), 200.0);
  r.peak_gflops = 400.0;
  EXPECT_DOUBLE_EQ(r.peak_fraction(), 0.25);
  r.kernel_peak_gflops = -1.0;  // not measured (no oneDNN sgemm)
  EXPECT_DOUBLE_EQ(r.peak_fraction(), 0.25);
  r.peak_gflops = -1.0;
  EXPECT_LT(r.peak_fraction(), 0.0);
  EXPECT_TRUE(to_json(r)["peak_fraction"].is_null());
}

TEST(Bench, InferOnlyLeavesTrainingFiguresNull) {
  BenchOptions options = short_run("cpu", /*batch_size=*/2, /*steps=*/2, /*warmup=*/0, /*peak_seconds=*/0.0);
  options.mode = "infer";
  const auto json = to_json(run_bench(small_model(), options));
  EXPECT_TRUE(json["step_ms_p50"].is_null());
  EXPECT_TRUE(json["peak_fraction"].is_null());  // no peak measured
  EXPECT_TRUE(json["img_per_s"].is_number());    // inference throughput at the batch size
}

TEST(Bench, RejectsBadOptions) {
  BenchOptions options;
  options.device = "cpu";
  options.mode = "fast";
  EXPECT_THROW(run_bench(small_model(), options), std::invalid_argument);
  options.mode = "train";
  auto headless = small_model();
  headless.num_classes = 0;
  EXPECT_THROW(run_bench(headless, options), std::invalid_argument);
}

TEST(Bench, CommandPrintsOneJsonObject) {
  test::TempDir dir;
  const auto config = dir.file("tiny.json");
  test::write_bytes(config, R"({"model": {"img_size": 32, "patch_size": 8, "num_classes": 10, "embed_dim": 64,)"
                            R"( "depth": 2, "num_heads": 4, "mlp_ratio": 2}})");
  const auto run =
      test::run_vit("bench --config " + config + " --batch-size 2 --steps 2 --warmup 0 --threads 1 --json");
  ASSERT_EQ(run.status, 0) << run.errors;
  const auto json = nlohmann::json::parse(run.output);
  for (const char* key : {"img_per_s", "step_ms_p50", "step_ms_p95", "latency_ms_p50", "latency_ms_p95", "peak_rss_mb",
                          "gflops", "peak_fraction"}) {
    EXPECT_TRUE(json.contains(key) && json[key].is_number()) << key;
  }
  EXPECT_EQ(json["threads"], 1);
  EXPECT_EQ(json["batch_size"], 2);
  EXPECT_EQ(test::run_vit("bench --config " + config + " --mode fast").status, 2);
}

// The all-reduce cost per optimiser step for the gradients of the Fashion-MNIST default (configs/fashion_mnist.json)
// and of ViT-S/16 (the preset), on loopback (two ranks as two threads): printed for the record, checked for the
// right mean. Training logs the same wait per step as metrics.jsonl's comm_ms.
TEST(Bench, AllReduceCostPerStepForFashionMnistAndVitSmall) {
  SKIP_WITHOUT_C10D();
  const ModelConfig fashion = load_config(test::config_path("fashion_mnist.json")).model;
  const std::vector<std::pair<std::string, int64_t>> models{
      {"F-MNIST default", count_parameters(*VisionTransformer(fashion))},
      {"ViT-S/16", count_parameters(*VisionTransformer(model_preset("vit_small_patch16_224")))}};
  for (const auto& [name, count] : models) {
    std::vector<double> median_ms(2);
    std::vector<bool> correct(2);
    test::with_two_ranks([&, count = count](Communicator& comm) {
      auto flat = torch::full({count}, static_cast<float>(comm.rank() + 1));
      std::vector<double> times;
      for (int i = 0; i < 6; ++i) {
        flat.fill_(static_cast<float>(comm.rank() + 1));
        const auto start = Clock::now();
        test::all_reduce_mean(comm, flat);
        if (i > 0) times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
      }
      std::sort(times.begin(), times.end());
      median_ms[comm.rank()] = times[times.size() / 2];
      correct[comm.rank()] = torch::allclose(flat, torch::full({count}, 1.5f));
    });
    EXPECT_TRUE(correct[0] && correct[1]) << name;
    std::cout << name << ": " << count << " parameters (" << count * 4 / 1e6 << " MB of gradients), all-reduce over "
              << "2 ranks on loopback: median " << median_ms[0] << " ms per step\n";
  }
}

}  // namespace
}  // namespace vit
