// CUDA against CPU (forward, backward), bf16 and fp16 training, and NCCL in a group of one. Every case skips with a
// visible reason where this libtorch has no CUDA or no GPU is visible (Debian's CPU libtorch).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "model/vit.h"
#include "test_util.h"
#include "train/optimizer.h"
#include "model/autocast.h"
#include "train/distributed.h"
#include "train/trainer.h"

namespace vit {
namespace {

ModelConfig small_model() {
  return test::tiny_vit(/*img=*/32, /*patch=*/8, /*in_chans=*/3, /*num_classes=*/10, /*embed_dim=*/64, /*depth=*/2,
                        /*num_heads=*/4, /*mlp_ratio=*/2.0);
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

// --precision fp16 and bf16 on CUDA: forward under autocast, float32 logits out, close to float32's (cosine >= 0.999),
// and the same model back in fp32 gives float32's logits again.
TEST(Cuda, Fp16AndBf16InferenceStayCloseToFloat32) {
  SKIP_WITHOUT_CUDA();
  at::globalContext().setAllowTF32CuBLAS(false);
  torch::manual_seed(0);
  VisionTransformer net(small_model());
  const torch::Device cuda(torch::kCUDA, 0);
  net->to(cuda);
  net->eval();
  torch::NoGradGuard no_grad;
  const auto images = torch::randn({8, 3, 32, 32}).to(cuda);
  const auto reference = net->forward(images).cpu();
  for (const auto precision : {Precision::fp16, Precision::bf16}) {
    net->set_precision(precision);
    const auto logits = net->forward(images);
    ASSERT_EQ(logits.scalar_type(), torch::kFloat);
    const auto cpu = logits.cpu();
    const double cosine =
        (cpu.flatten() * reference.flatten()).sum().item<double>() / (cpu.norm() * reference.norm()).item<double>();
    std::printf("CUDA %s vs fp32: logits cosine %.6f, max |d| %.3g\n", name_of(precision), cosine,
                test::max_abs_diff(cpu, reference));
    EXPECT_GE(cosine, 0.999) << name_of(precision);
    EXPECT_GT(test::max_abs_diff(cpu, reference), 0.0) << "autocast did not run";
  }
  net->set_precision(Precision::fp32);
  EXPECT_EQ(test::max_abs_diff(net->forward(images).cpu(), reference), 0.0);
  EXPECT_NE(test::error_of([&] { net->set_precision(Precision::int8); }).find("CPU only"), std::string::npos);
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
  SKIP_WITHOUT_C10D();
  DistEnv env;
  env.master_port = test::free_port();
  TrainConfig train;
  train.dist_backend = DistBackend::nccl;
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

}  // namespace
}  // namespace vit
