// CUDA against CPU (forward, backward), a bf16 training step, and `vit bench` on both devices. The CUDA cases skip
// with a visible reason where this libtorch has no CUDA or no GPU is visible (Debian's CPU libtorch).
#include <gtest/gtest.h>

#include <torch/cuda.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "bench/bench.h"
#include "vit/build_config.h"
#include "model/vit.h"
#include "test_util.h"
#include "train/optimizer.h"
#include "train/amp.h"
#include "train/distributed.h"
#include "train/trainer.h"

namespace vit {
namespace {

#define SKIP_WITHOUT_CUDA()                                                                                     \
  if (!torch::cuda::is_available()) {                                                                           \
    GTEST_SKIP() << "CUDA test skipped: this libtorch (" TORCH_VERSION ") has no CUDA support or no GPU is visible"; \
  }

ModelConfig small_model() {
  ModelConfig m;
  m.img_h = m.img_w = 32;
  m.patch_size = 8;
  m.in_chans = 3;
  m.num_classes = 10;
  m.embed_dim = 64;
  m.depth = 2;
  m.num_heads = 4;
  m.mlp_ratio = 2.0;
  return m;
}

// A second model with the same weights on `device`.
VisionTransformer copy_to(const VisionTransformer& source, const torch::Device& device) {
  VisionTransformer copy(source->config());
  copy->to(device);
  torch::NoGradGuard no_grad;
  auto target = copy->named_parameters();
  for (const auto& item : source->named_parameters()) target[item.key()].copy_(item.value());
  return copy;
}

// max |a - b| / max |a|: gradients differ in scale from parameter to parameter.
double relative_diff(const torch::Tensor& expected, const torch::Tensor& actual) {
  const double scale = std::max(expected.abs().max().item<double>(), 1e-12);
  return test::max_abs_diff(expected, actual.to(torch::kCPU, torch::kFloat32)) / scale;
}


TEST(Cuda, ForwardAndBackwardMatchCpu) {
  SKIP_WITHOUT_CUDA();
  // fp32 on both sides: no TF32 in cuBLAS or cuDNN, or the comparison measures TF32's 10-bit mantissa.
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
  torch::manual_seed(0);
  VisionTransformer cpu_net(small_model());
  const torch::Device cuda(torch::kCUDA, 0);
  auto cuda_net = copy_to(cpu_net, cuda);
  auto images = torch::randn({4, 3, 32, 32});
  auto labels = torch::randint(0, 10, {4}, torch::kInt64);

  auto cpu_logits = cpu_net->forward(images);
  auto cuda_logits = cuda_net->forward(images.to(cuda));
  const double forward_diff = test::max_abs_diff(cpu_logits, cuda_logits.to(torch::kCPU));
  std::printf("CUDA vs CPU logits: max |diff| %.3g\n", forward_diff);
  EXPECT_LT(forward_diff, 1e-4);

  classification_loss(cpu_logits, labels, {}, 0.1).backward();
  classification_loss(cuda_logits, labels.to(cuda), {}, 0.1).backward();
  auto cuda_params = cuda_net->named_parameters();
  double worst = 0.0;
  for (const auto& item : cpu_net->named_parameters()) {
    const auto& cuda_grad = cuda_params[item.key()].grad();
    ASSERT_TRUE(cuda_grad.defined()) << item.key() << " has no gradient on CUDA";
    const double diff = relative_diff(item.value().grad(), cuda_grad);
    EXPECT_LT(diff, 1e-3) << item.key();
    worst = std::max(worst, diff);
  }
  std::printf("CUDA vs CPU gradients: max relative diff %.3g\n", worst);
}

TEST(Cuda, Bf16TrainingStepIsFiniteAndLowersTheLoss) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(0);
  const torch::Device cuda(torch::kCUDA, 0);
  VisionTransformer net(small_model());
  net->to(cuda);
  net->train();
  TrainConfig train;
  train.weight_decay = 0.0;
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& item : net->named_parameters()) named.emplace_back(item.key(), item.value());
  FlatAdamW optimizer(named, train);
  // One fixed batch: the loss on it must fall as the model fits it.
  auto images = torch::randn({32, 3, 32, 32}, cuda);
  auto labels = torch::randint(0, 10, {32}, torch::TensorOptions().device(cuda).dtype(torch::kInt64));
  std::vector<double> losses;
  for (int step = 0; step < 20; ++step) {
    optimizer.zero_grad();
    torch::Tensor loss;
    {
      AutocastScope autocast(/*enabled=*/true, at::kBFloat16);
      auto logits = net->forward(images);
      EXPECT_EQ(logits.scalar_type(), torch::kBFloat16) << "autocast did not reach the head";
      loss = classification_loss(logits, labels, {}, 0.1);
    }
    loss.backward();
    const double norm = optimizer.clip_grad_norm(1.0);
    ASSERT_TRUE(std::isfinite(norm)) << "gradient norm " << norm << " at step " << step;
    optimizer.step(1e-3);
    losses.push_back(loss.item<double>());
    ASSERT_TRUE(std::isfinite(losses.back())) << "loss " << losses.back() << " at step " << step;
    ASSERT_TRUE(optimizer.params().isfinite().all().item<bool>()) << "non-finite parameters after step " << step;
  }
  std::printf("bf16 loss: first %.4f, last %.4f\n", losses.front(), losses.back());
  EXPECT_LT(losses.back(), 0.8 * losses.front());
}

TEST(Cuda, BenchRunsOnCuda) {
  SKIP_WITHOUT_CUDA();
  BenchOptions options;
  options.device = "cuda";
  options.amp = "bf16";
  options.batch_size = 8;
  options.steps = 3;
  options.warmup = 1;
  options.peak_seconds = 0.1;
  const auto result = run_bench(small_model(), options);
  EXPECT_EQ(result.device, "cuda:0");
  EXPECT_EQ(result.amp, "bf16");
  EXPECT_GT(result.train_img_per_s, 0.0);
  EXPECT_GT(result.latency_ms_p50, 0.0);
  EXPECT_GT(result.peak_gflops, 0.0);
}

TEST(Cuda, Fp16TrainingWithLossScalingLearns) {
  SKIP_WITHOUT_CUDA();
  test::TempDir dir;
  test::write_idx_dataset(dir / "data", 256, 64);
  nlohmann::json doc{
      {"model", {{"img_size", 16}, {"patch_size", 4}, {"in_chans", 1}, {"num_classes", 4}, {"embed_dim", 32},
                 {"depth", 2}, {"num_heads", 2}, {"mlp_ratio", 2.0}}},
      {"data", {{"format", "mnist"}, {"root", dir / "data"}, {"mean", {0.5}}, {"std", {0.5}}, {"num_workers", 1}}},
      {"train", {{"epochs", 3}, {"batch_size", 32}, {"lr", 2e-3}, {"warmup_steps", 3}, {"device", "cuda"},
                 {"amp", "fp16"}, {"output_root", dir / "runs"}}}};
  TrainRequest request;
  request.config = parse_config(doc, "fp16 test config");
  request.out_dir = dir / "run";
  const auto result = train(request);
  ASSERT_EQ(result.history.size(), 3u);
  for (const auto& epoch : result.history) ASSERT_TRUE(std::isfinite(epoch.train_loss)) << "epoch " << epoch.epoch;
  std::printf("fp16 with loss scaling: train loss %.4f -> %.4f, eval top-1 %.1f%%\n",
              result.history.front().train_loss, result.history.back().train_loss, result.final_top1);
  EXPECT_LT(result.history.back().train_loss, result.history.front().train_loss);
  EXPECT_GT(result.final_top1, 50.0);  // 4 classes: chance is 25%
}

TEST(Cuda, NcclGroupOfOneRunsCollectives) {
  SKIP_WITHOUT_CUDA();
  if (!VIT_WITH_DISTRIBUTED) GTEST_SKIP() << "built with VIT_WITH_DISTRIBUTED=OFF: no c10d to test";
  DistEnv env;
  env.master_port = test::free_port();
  TrainConfig train;
  train.dist_backend = "nccl";
  train.dist_timeout_s = 60;
  const torch::Device cuda(torch::kCUDA, 0);
  auto comm = join_process_group(env, train, cuda);  // throws when this build has no NCCL
  ASSERT_EQ(comm->world_size(), 1);
  std::vector<torch::Tensor> tensors{torch::arange(1000, torch::TensorOptions().device(cuda)),
                                     torch::full({7}, 3.0, torch::TensorOptions().device(cuda))};
  const auto expected = tensors[0].clone();
  comm->all_reduce_sum(tensors);  // the sum over one rank is the tensor itself
  comm->broadcast(tensors, 0);
  comm->barrier();
  EXPECT_TRUE(torch::equal(tensors[0], expected));
  EXPECT_TRUE(torch::equal(tensors[1], torch::full({7}, 3.0, torch::TensorOptions().device(cuda))));
}

// ---- device-independent checks of the bench itself ----

TEST(Bench, PercentileIsNearestRank) {
  EXPECT_DOUBLE_EQ(percentile({5, 1, 4, 2, 3}, 50), 3.0);
  EXPECT_DOUBLE_EQ(percentile({5, 1, 4, 2, 3}, 95), 5.0);
  EXPECT_DOUBLE_EQ(percentile({5, 1, 4, 2, 3}, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile({7}, 95), 7.0);
  EXPECT_TRUE(std::isnan(percentile({}, 50)));
}

TEST(Bench, RunsOnCpuAndReportsEveryField) {
  BenchOptions options;
  options.device = "cpu";
  options.batch_size = 4;
  options.steps = 3;
  options.warmup = 1;
  options.peak_seconds = 0.05;
  const auto result = run_bench(small_model(), options);
  EXPECT_EQ(result.device, "cpu");
  EXPECT_GT(result.train_img_per_s, 0.0);
  EXPECT_LE(result.step_ms_p50, result.step_ms_p95);
  EXPECT_LE(result.latency_ms_p50, result.latency_ms_p95);
  EXPECT_GT(result.batch_latency_ms_p50, 0.0);
  EXPECT_GT(result.peak_gflops, 0.0);
  EXPECT_GT(result.peak_fraction(), 0.0);
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
}

TEST(Bench, InferOnlyLeavesTrainingFiguresNull) {
  BenchOptions options;
  options.device = "cpu";
  options.mode = "infer";
  options.batch_size = 2;
  options.steps = 2;
  options.warmup = 0;
  options.peak_seconds = 0.0;
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
  {
    std::FILE* f = std::fopen(config.c_str(), "w");
    ASSERT_NE(f, nullptr) << config;
    std::fputs(R"({"model": {"img_size": 32, "patch_size": 8, "num_classes": 10, "embed_dim": 64, "depth": 2,)"
               R"( "num_heads": 4, "mlp_ratio": 2}})",
               f);
    std::fclose(f);
  }
  const auto run = test::run_vit("bench --config " + config + " --batch-size 2 --steps 2 --warmup 0 --threads 1 --json");
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

}  // namespace
}  // namespace vit
