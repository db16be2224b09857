// Training: schedule, AdamW groups and arithmetic, accumulation, overfitting a batch, and through the `vit` binary:
// run directory contents, exact resume after a graceful stop and after SIGKILL, divergence errors.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "io/model_file.h"
#include "io/safetensors.h"
#include "model/vit.h"
#include "test_util.h"
#include "train/optimizer.h"
#include "train/run_dir.h"
#include "train/schedule.h"
#include "train/trainer.h"
#include "vit/build_config.h"

namespace vit {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

ModelConfig tiny_model() {
  return test::tiny_vit(/*img=*/16, /*patch=*/4, /*in_chans=*/1, /*num_classes=*/4, /*embed_dim=*/32, /*depth=*/2,
                        /*num_heads=*/2, /*mlp_ratio=*/2.0);
}

// A config file for the tiny dataset; `train` entries override the defaults below.
std::string write_config(const std::string& dir, const std::string& data_root, const json& train_overrides = json::object()) {
  json train{{"epochs", 3},        {"batch_size", 16},        {"lr", 2e-3},          {"warmup_steps", 5},
             {"min_lr", 1e-5},     {"label_smoothing", 0.1},  {"log_interval", 5},   {"checkpoint_interval", 7},
             {"threads", 2},       {"seed", 7},               {"output_root", dir + "/runs"}};
  train.update(train_overrides);
  json doc{{"model", to_json(tiny_model())},
           {"data", {{"format", "mnist"}, {"root", data_root}, {"mean", {0.5}}, {"std", {0.5}}, {"num_workers", 2}}},
           {"train", train}};
  doc["model"]["attn_drop_rate"] = 0.1;  // dropout makes exact resume depend on the saved RNG state
  doc["model"]["drop_path_rate"] = 0.1;
  const std::string path = dir + "/config.json";
  std::ofstream(path) << doc.dump(2);
  return path;
}

TEST(TrainSchedule, WarmupThenCosine) {
  TrainConfig t;
  t.lr = 1e-3, t.min_lr = 1e-5, t.warmup_lr = 1e-6, t.warmup_steps = 10, t.epochs = 2;
  const auto s = make_schedule(t, 55);
  EXPECT_EQ(s.total_steps, 110);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 1e-6);
  EXPECT_NEAR(s.lr_at(5), 1e-6 + (1e-3 - 1e-6) * 0.5, 1e-15);
  EXPECT_DOUBLE_EQ(s.lr_at(10), 1e-3);
  EXPECT_NEAR(s.lr_at(60), (1e-3 + 1e-5) / 2, 1e-12);  // halfway through the cosine
  EXPECT_DOUBLE_EQ(s.lr_at(110), 1e-5);
  t.warmup_steps = 0, t.warmup_epochs = 0.5;
  EXPECT_EQ(make_schedule(t, 55).warmup_steps, 28);
}

TEST(TrainOptimizer, NoWeightDecayGroupAndAdamWArithmetic) {
  torch::manual_seed(0);
  VisionTransformer ours(tiny_model()), reference(tiny_model());
  {
    torch::NoGradGuard no_grad;
    for (auto& p : reference->named_parameters()) p.value().copy_(ours->named_parameters()[p.key()]);
  }
  TrainConfig t;
  t.weight_decay = 0.05;
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& p : ours->named_parameters()) named.emplace_back(p.key(), p.value());
  FlatAdamW optimizer(named, t);
  int64_t decayed = 0;
  for (const auto& [name, p] : named) {
    if (!no_weight_decay(name, p)) decayed += p.numel();
    const bool expect_no_decay = p.dim() == 1 || name == "pos_embed" || name == "cls_token";
    EXPECT_EQ(no_weight_decay(name, p), expect_no_decay) << name;
  }
  EXPECT_EQ(optimizer.decay_size(), decayed);

  // torch::optim::AdamW with the same two groups is the reference.
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& p : reference->named_parameters()) {
    (no_weight_decay(p.key(), p.value()) ? no_decay : decay).push_back(p.value());
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(1e-2).weight_decay(0.05)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(1e-2).weight_decay(0.0)));
  torch::optim::AdamW adamw(groups, torch::optim::AdamWOptions(1e-2));
  auto x = torch::randn({8, 1, 16, 16});
  auto y = torch::randint(0, 4, {8});
  for (int step = 0; step < 3; ++step) {
    optimizer.zero_grad();
    classification_loss(ours->forward(x), y, {}, 0.1).backward();
    optimizer.step(1e-2);
    adamw.zero_grad();
    classification_loss(reference->forward(x), y, {}, 0.1).backward();
    adamw.step();
  }
  double worst = 0;
  std::string worst_name;
  for (const auto& p : reference->named_parameters()) {
    auto a = p.value(), b = ours->named_parameters()[p.key()];
    if (p.key().find("attn.qkv.bias") != std::string::npos) {
      // The key bias adds a constant to every logit of a row, which softmax ignores: its gradient is rounding
      // noise that Adam normalises to full-size steps, so only the q and v parts can be compared.
      const int64_t D = a.size(0) / 3;
      a = torch::cat({a.narrow(0, 0, D), a.narrow(0, 2 * D, D)});
      b = torch::cat({b.narrow(0, 0, D), b.narrow(0, 2 * D, D)});
    }
    const double d = test::max_abs_diff(a, b);
    if (d > worst) worst = d, worst_name = p.key();
  }
  std::cout << "flat AdamW vs torch::optim::AdamW after 3 steps: max |d| " << worst << " (" << worst_name << ")\n";
  EXPECT_LT(worst, 1e-5);
}

TEST(TrainLoss, LabelSmoothingMatchesTorchAndSoftTargets) {
  auto logits = torch::randn({6, 5});
  auto labels = torch::randint(0, 5, {6});
  namespace F = torch::nn::functional;
  auto reference = F::cross_entropy(logits, labels, F::CrossEntropyFuncOptions().label_smoothing(0.1));
  EXPECT_NEAR(classification_loss(logits, labels, {}, 0.1).item<double>(), reference.item<double>(), 1e-6);
  auto soft = torch::full({6, 5}, 0.02);
  soft.scatter_(1, labels.unsqueeze(1), 0.92);
  EXPECT_NEAR(classification_loss(logits, labels, soft, 0.0).item<double>(), reference.item<double>(), 1e-6);
}

TEST(TrainAccumulation, TwoHalfBatchesEqualOneFullBatch) {
  torch::manual_seed(1);
  VisionTransformer net(tiny_model());
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& p : net->named_parameters()) named.emplace_back(p.key(), p.value());
  FlatAdamW optimizer(named, TrainConfig{});
  auto x = torch::randn({16, 1, 16, 16});
  auto y = torch::randint(0, 4, {16});
  optimizer.zero_grad();
  classification_loss(net->forward(x), y, {}, 0.1).backward();
  const auto full = optimizer.grads().clone();
  optimizer.zero_grad();
  for (int half = 0; half < 2; ++half) {
    (classification_loss(net->forward(x.narrow(0, 8 * half, 8)), y.narrow(0, 8 * half, 8), {}, 0.1) / 2.0).backward();
  }
  const double diff = test::max_abs_diff(full, optimizer.grads());
  std::cout << "accumulated 2 x 8 vs batch 16 gradients: max |d| " << diff << "\n";
  EXPECT_LT(diff, 1e-6);
  EXPECT_GT(full.abs().max().item<double>(), 1e-4);
}

TEST(TrainOverfit, OneSmallBatchDrivesLossNearZero) {
  torch::manual_seed(2);
  VisionTransformer net(tiny_model());
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& p : net->named_parameters()) named.emplace_back(p.key(), p.value());
  TrainConfig t;
  t.weight_decay = 0.0;
  FlatAdamW optimizer(named, t);
  auto x = torch::randn({16, 1, 16, 16});
  auto y = torch::randint(0, 4, {16});
  double first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    optimizer.zero_grad();
    auto loss = classification_loss(net->forward(x), y, {}, 0.0);
    loss.backward();
    optimizer.clip_grad_norm(1.0);
    optimizer.step(2e-3);
    (step == 0 ? first : last) = loss.item<double>();
  }
  std::cout << "overfit: loss " << first << " -> " << last << "\n";
  EXPECT_LT(last, 0.02);
}

TEST(TrainRun, WritesRunDirectoryAndLearns) {
  test::TempDir dir;
  test::write_idx_dataset(dir.file("data"), 512, 128);
  const auto config = write_config(dir.path(), dir.file("data"), {{"ema_decay", 0.9}, {"final_weights", "ema"}});
  const auto result = test::run_vit("train --config '" + config + "' --out '" + dir.file("run") + "'");
  ASSERT_EQ(result.status, 0) << result.errors;
  for (const char* name : {"config.json", "summary.csv", "metrics.jsonl", "last.safetensors", "best.safetensors",
                           "ema.safetensors", "final.safetensors", "state.safetensors"}) {
    EXPECT_TRUE(fs::exists(dir.file("run/") + name)) << name;
  }
  // The curves are drawn with OpenCV; a core-only build (no OpenCV, e.g. on a GPU machine) trains without them.
  EXPECT_EQ(fs::exists(dir.file("run/curves.png")), VIT_WITH_OPENCV == 1);
  std::ifstream summary(dir.file("run/summary.csv"));
  std::string header, line, last;
  std::getline(summary, header);
  EXPECT_EQ(header, "epoch,train_loss,eval_loss,eval_top1,eval_top5,lr,epoch_seconds,img_per_s");
  int rows = 0;
  while (std::getline(summary, line)) last = line, ++rows;
  EXPECT_EQ(rows, 3);
  const double top1 = std::stod(last.substr(last.find(',', last.find(',', last.find(',') + 1) + 1) + 1));
  EXPECT_GT(top1, 90.0) << last;  // the squares are easy to find
  EXPECT_TRUE(fs::is_symlink(dir.file("runs/latest")) || !fs::exists(dir.file("runs/latest")));
  // The EMA lags the live weights: close to them, not equal.
  const auto live = safetensors::read(dir.file("run/last.safetensors"));
  const auto ema = safetensors::read(dir.file("run/ema.safetensors"));
  const double lag = test::max_abs_diff(live.tensor("head.weight"), ema.tensor("head.weight"));
  EXPECT_GT(lag, 0.0);
  EXPECT_LT(lag, 0.5);
  EXPECT_NE(result.errors.find("EMA top-1"), std::string::npos);
  // final.safetensors holds the weights the config declared (the EMA at the last step), whatever scored best.
  const auto final_weights = safetensors::read(dir.file("run/final.safetensors"));
  for (const auto& info : ema.tensors) {
    EXPECT_TRUE(torch::equal(final_weights.tensor(info.name), ema.tensor(info))) << info.name;
  }
  EXPECT_EQ(final_weights.metadata.at("weights"), "ema");
  // The run folder itself names the model: its final.safetensors, said in one line.
  const auto info = test::run_vit("info --checkpoint '" + dir.file("run") + "'");
  ASSERT_EQ(info.status, 0) << info.errors;
  EXPECT_NE(info.errors.find("final.safetensors: loaded as the run folder's final.safetensors"), std::string::npos)
      << info.errors;
  // Every model file's metadata names the weights it holds.
  EXPECT_EQ(ema.metadata.at("weights"), "ema");
  EXPECT_EQ(live.metadata.at("weights"), "model");
  EXPECT_NE(result.output.find("final.safetensors (ema weights"), std::string::npos) << result.output;
  const auto model = load_model(dir.file("run/best.safetensors"));
  EXPECT_EQ(model.class_names, (std::vector<std::string>{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}));
}

// data.eval_hflip: train's evaluations and `vit evaluate` score the same mirror-averaged logits (the same loss on
// the same weights), which differ from the plain pass's; training itself is untouched by it; `vit export` to another
// format warns that the mirror is not part of it.
TEST(TrainRun, EvalHflipScoresTrainsEvaluationsAndEvaluateAlike) {
  test::TempDir dir;
  test::write_idx_dataset(dir.file("data"), 512, 64);
  const auto config = write_config(dir.path(), dir.file("data"));
  auto last_eval_loss = [&](const std::string& run) {
    std::ifstream summary(run + "/summary.csv");
    std::string line, last;
    while (std::getline(summary, line)) last = line;
    const auto from = last.find(',', last.find(',') + 1) + 1;  // epoch,train_loss,eval_loss,...
    return std::stod(last.substr(from, last.find(',', from) - from));
  };
  std::map<bool, double> trained, evaluated;
  for (const bool hflip : {false, true}) {
    const std::string run = dir.file(hflip ? "hflip" : "plain");
    const auto result = test::run_vit("train --config '" + config +
                                      "' --set data.eval_hflip=" + (hflip ? "true" : "false") + " --out '" + run + "'");
    ASSERT_EQ(result.status, 0) << result.errors;
    const auto scored = test::run_vit("evaluate --checkpoint '" + run + "/last.safetensors' --split val --json");
    ASSERT_EQ(scored.status, 0) << scored.errors;
    const auto report = json::parse(scored.output);
    EXPECT_EQ(report.at("eval_hflip"), hflip) << "last.safetensors carries eval_hflip";
    trained[hflip] = last_eval_loss(run);
    evaluated[hflip] = report.at("loss").get<double>();
    std::cout << "eval_hflip " << hflip << ": train's eval loss " << trained[hflip] << ", vit evaluate's "
              << evaluated[hflip] << "\n";
    EXPECT_NEAR(evaluated[hflip], trained[hflip], 1e-6 * trained[hflip]);
    // An exported timm snapshot is the plain model, and vit export says so for a model that averages the mirror.
    const auto exported =
        test::run_vit("export --checkpoint '" + run + "/last.safetensors' --format timm --out '" + run + "-timm'");
    ASSERT_EQ(exported.status, 0) << exported.errors;
    EXPECT_EQ(exported.errors.find("eval_hflip (flip test-time augmentation) is not part of the exported timm model") !=
                  std::string::npos,
              hflip)
        << exported.errors;
  }
  EXPECT_TRUE(torch::equal(safetensors::read(dir.file("plain/last.safetensors")).tensor("head.weight"),
                           safetensors::read(dir.file("hflip/last.safetensors")).tensor("head.weight")))
      << "the same training either way";
  EXPECT_GT(std::abs(trained[true] - trained[false]), 1e-4) << "the mirror's pass changes the loss";
}

class TrainResume : public ::testing::TestWithParam<int> {};

TEST_P(TrainResume, ResumedRunEndsBitIdenticalToStraightRun) {
  test::TempDir dir;
  test::write_idx_dataset(dir.file("data"), 1024, 64);
  const auto config = write_config(dir.path(), dir.file("data"), {{"epochs", 3}, {"checkpoint_interval", 5}});
  auto straight = test::run_vit("train --config '" + config + "' --out '" + dir.file("straight") + "'");
  ASSERT_EQ(straight.status, 0) << straight.errors;

  const int signal = GetParam();
  const std::string interrupted = dir.file("interrupted");
  const int status = test::run_vit_and_kill("train --config '" + config + "' --out '" + interrupted + "'",
                                    interrupted + "/state.safetensors", signal);
  if (signal == SIGKILL) {
    EXPECT_TRUE(WIFSIGNALED(status));
  } else {
    EXPECT_TRUE(WIFEXITED(status) && (WEXITSTATUS(status) == 130 || WEXITSTATUS(status) == 0));
  }
  auto resumed = test::run_vit("train --resume '" + interrupted + "'");
  ASSERT_EQ(resumed.status, 0) << resumed.errors;
  const auto a = safetensors::read(dir.file("straight/last.safetensors"));
  const auto b = safetensors::read(interrupted + "/last.safetensors");
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& info : a.tensors) {
    EXPECT_TRUE(torch::equal(a.tensor(info), b.tensor(info.name))) << info.name;
  }
  const auto state_a = safetensors::read(dir.file("straight/state.safetensors"));
  const auto state_b = safetensors::read(interrupted + "/state.safetensors");
  EXPECT_TRUE(torch::equal(state_a.tensor("optimizer.exp_avg_sq"), state_b.tensor("optimizer.exp_avg_sq")));
  std::ifstream summary(interrupted + "/summary.csv");
  int lines = 0;
  for (std::string line; std::getline(summary, line);) ++lines;
  EXPECT_EQ(lines, 4);  // header + 3 epochs, none repeated
}

INSTANTIATE_TEST_SUITE_P(Signals, TrainResume, ::testing::Values(SIGTERM, SIGKILL),
                         [](const auto& info) { return info.param == SIGKILL ? "SIGKILL" : "SIGTERM"; });

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A full disk at a checkpoint (here a file-size limit that the state file is over, set with the shell's ulimit so it
// works in any CI container): the run stops with exit 1 and a message naming the file, and every file it had written
// before is byte for byte as it was, with no temp file left behind.
TEST(TrainErrors, FullDiskAtACheckpointKeepsThePreviousFiles) {
  test::TempDir dir;
  test::write_idx_dataset(dir.file("data"), 512, 64);
  const auto config = write_config(dir.path(), dir.file("data"), {{"epochs", 3}, {"checkpoint_interval", 4}});
  const std::string run = dir.file("run");
  test::run_vit_and_kill("train --config '" + config + "' --out '" + run + "'", run + "/state.safetensors", SIGKILL);
  std::map<std::string, std::string> before;  // every file of the run, as the killed process left it
  for (const auto& entry : fs::directory_iterator(run)) {
    if (entry.is_regular_file()) before[entry.path().filename().string()] = file_bytes(entry.path().string());
  }
  ASSERT_GT(before["state.safetensors"].size(), 128u << 10);
  // 128 blocks: 64 KiB (dash counts 512-byte blocks) or 128 KiB (bash, 1024): under the state and model files, over
  // config.json and the metrics lines.
  const auto full = test::run_vit("train --resume '" + run + "'", "ulimit -f 128; ");
  EXPECT_EQ(full.status, 1) << full.errors;
  EXPECT_NE(full.errors.find("File too large; the previous " + run + "/"), std::string::npos) << full.errors;
  for (const auto& [name, bytes] : before) {
    if (name == "metrics.jsonl" || name == "train.lock") continue;  // grow with the resumed steps; its pid
    EXPECT_TRUE(file_bytes(run + "/" + name) == bytes) << name;
  }
  for (const auto& entry : fs::directory_iterator(run)) {
    const std::string name = entry.path().filename().string();
    EXPECT_TRUE(before.count(name) || name.find(".tmp.") == std::string::npos) << "left behind: " << name;
  }
}

// Two `vit train` on one run directory: the second stops at once, naming the first's pid; once the first is gone
// (even by SIGKILL, which runs no clean-up) the lock is free again and the run resumes.
TEST(TrainErrors, ASecondRunOnTheSameDirectoryRefusesAndACrashedOneLeavesNoStuckLock) {
  test::TempDir dir;
  test::write_idx_dataset(dir.file("data"), 512, 64);
  const auto config = write_config(dir.path(), dir.file("data"), {{"epochs", 1000}, {"checkpoint_interval", 3}});
  const std::string run = dir.file("run");
  const pid_t first = ::fork();
  ASSERT_GE(first, 0);
  if (first == 0) {
    const std::string out = dir.file("first.log");
    const std::string command = std::string("exec '") + VIT_BINARY + "' train --config '" + config + "' --out '" +
                                run + "' >'" + out + "' 2>&1";
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!fs::exists(run + "/state.safetensors") && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(fs::exists(run + "/state.safetensors")) << file_bytes(dir.file("first.log"));

  const auto start = std::chrono::steady_clock::now();
  const auto second = test::run_vit("train --resume '" + run + "'");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto other = test::run_vit("train --config '" + config + "' --out '" + run + "'");
  ::kill(first, SIGKILL);
  int status = 0;
  ::waitpid(first, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status)) << "the first run ended before it was killed: " << file_bytes(dir.file("first.log"));
  EXPECT_EQ(second.status, 1) << second.errors;
  const std::string in_use = run + ": in use by another vit train (pid " + std::to_string(first) + ", holding " +
                             run + "/train.lock)";
  EXPECT_NE(second.errors.find(in_use), std::string::npos) << second.errors;
  EXPECT_NE(other.errors.find(in_use), std::string::npos) << other.errors;
  std::cout << "second run refused after " << seconds << " s\n";

  EXPECT_NO_THROW(RunLock{run}) << "the killed run's lock is free";
}

TEST(TrainErrors, NanLossStopsWithClearErrorAndKeepsCheckpoint) {
  test::TempDir dir;
  test::write_idx_dataset(dir.file("data"), 128, 32);
  const auto config = write_config(dir.path(), dir.file("data"));
  // A model whose head is NaN: the very first loss is NaN.
  torch::manual_seed(3);
  auto model = tiny_model();
  model.num_classes = 10;
  VisionTransformer poisoned(model);
  {
    torch::NoGradGuard no_grad;
    poisoned->head->weight.fill_(std::nan(""));
  }
  save_model(dir.file("nan.safetensors"), poisoned, Preprocess{}, numbered_classes(10));
  auto result = test::run_vit("train --config '" + config + "' --out '" + dir.file("run") + "' --init-from '" +
                              dir.file("nan.safetensors") + "'");
  EXPECT_EQ(result.status, 1);
  EXPECT_NE(result.errors.find("training diverged: loss is nan at step 1"), std::string::npos) << result.errors;
  EXPECT_FALSE(fs::exists(dir.file("run/last.safetensors")));
  EXPECT_FALSE(fs::exists(dir.file("run/best.safetensors")));
}

TEST(TrainErrors, BadConfigValueExitsWithUsageStatus) {
  test::TempDir dir;
  const auto config = write_config(dir.path(), dir.file("data"), {{"batch_size", 0}});
  auto result = test::run_vit("train --config '" + config + "'");
  EXPECT_EQ(result.status, 2);
  EXPECT_NE(result.errors.find("train.batch_size: 0 must be at least 1"), std::string::npos) << result.errors;
}

}  // namespace
}  // namespace vit
