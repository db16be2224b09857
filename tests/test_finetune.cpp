// Fine-tuning: layer-wise lr decay (every parameter's effective lr against the formula, in the optimiser and through
// `vit train`), freezing (bit-identical frozen weights, no optimiser state, exact resume), and the dataset options a
// transfer run needs (data.classes, data.train_per_class).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "data/dataset.h"
#include "io/model_file.h"
#include "io/safetensors.h"
#include "model/vit.h"
#include "test_util.h"
#include "train/optimizer.h"
#include "train/schedule.h"

namespace vit {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

// Three blocks and every kind of parameter the layer rule names: class token, registers, norm_pre, fc_norm.
ModelConfig layered_model() {
  ModelConfig m = test::tiny_vit(16, 4, 1, 10, 32, 3, 2, 2.0);
  m.reg_tokens = 2;
  m.pre_norm = true;
  m.global_pool = GlobalPool::avg;
  m.fc_norm = true;
  return m;
}

// The issue's rule written out by hand, independent of layer_of().
int64_t expected_layer(const std::string& name, int64_t depth) {
  for (const char* stem : {"patch_embed.", "cls_token", "reg_token", "pos_embed", "norm_pre."}) {
    if (name.rfind(stem, 0) == 0) return 0;
  }
  for (int64_t i = 0; i < depth; ++i) {
    if (name.rfind("blocks." + std::to_string(i) + ".", 0) == 0) return i + 1;
  }
  return depth + 1;
}

TEST(FinetuneLayerDecay, LayerOfEveryParameterFollowsTheRule) {
  VisionTransformer net(layered_model());
  std::map<int64_t, int> per_layer;
  for (const auto& p : net->named_parameters()) {
    EXPECT_EQ(layer_of(p.key(), 3), expected_layer(p.key(), 3)) << p.key();
    ++per_layer[layer_of(p.key(), 3)];
  }
  EXPECT_EQ(per_layer.size(), 5u);  // layers 0 .. depth + 1 all occur
  EXPECT_EQ(layer_of("head.weight", 3), 4);
  EXPECT_EQ(layer_of("fc_norm.bias", 3), 4);
  EXPECT_EQ(layer_of("attn_pool.latent", 3), 4);
  EXPECT_EQ(layer_of("blocks.2.mlp.fc1.weight", 3), 3);
  EXPECT_DOUBLE_EQ(layer_decay_scale("patch_embed.proj.weight", 3, 0.5), 0.0625);
  EXPECT_DOUBLE_EQ(layer_decay_scale("head.bias", 3, 0.5), 1.0);
  EXPECT_NE(test::error_of([] { layer_of("blocks.3.norm1.weight", 3); }).find("not a block"), std::string::npos);
}

// Every parameter's effective learning rate at step 7 of a warmup + cosine schedule, read off the update itself.
// With a constant gradient of 1, Adam's bias-corrected moments are exactly 1, so one step moves a parameter by
// lr_eff / (1 + eps) and (decay group) first scales it by 1 - lr_eff * wd: lr_eff can be solved for per element.
void check_effective_lr(torch::Dtype dtype) {
  torch::manual_seed(3);
  const ModelConfig model = layered_model();
  VisionTransformer net(model);
  net->to(dtype);
  TrainConfig t;
  t.lr = 1e-2, t.min_lr = 1e-4, t.warmup_lr = 1e-5, t.warmup_steps = 4, t.epochs = 1, t.weight_decay = 0.1;
  const double decay = 0.7;
  const Schedule schedule = make_schedule(t, 20);
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& p : net->named_parameters()) named.emplace_back(p.key(), p.value());
  FlatAdamW optimizer(named, t, [&](const std::string& name) { return layer_decay_scale(name, model.depth, decay); });
  const int64_t chosen = 7;
  std::map<std::string, torch::Tensor> before;
  for (int64_t step = 0; step <= chosen; ++step) {
    if (step == chosen) {
      for (const auto& [name, p] : named) before[name] = p.detach().clone();
    }
    optimizer.grads().fill_(1.0);
    optimizer.step(schedule.lr_at(step));
  }
  const double lr = schedule.lr_at(chosen);
  double worst = 0.0;
  std::string worst_name;
  for (const auto& [name, p] : named) {
    const double expected = lr * std::pow(decay, static_cast<double>(model.depth + 1 - expected_layer(name, model.depth)));
    const auto old_value = before[name].to(torch::kFloat64);
    const auto moved = old_value - p.detach().to(torch::kFloat64);
    const double wd = no_weight_decay(name, p) ? 0.0 : t.weight_decay;
    // p_new = p_old (1 - lr_eff wd) - lr_eff / (1 + eps)  =>  lr_eff = (p_old - p_new) / (p_old wd + 1 / (1 + eps))
    const auto lr_eff = moved / (old_value * wd + 1.0 / (1.0 + t.eps));
    const double got = lr_eff.median().item<double>();
    const double relative = std::abs(got - expected) / expected;
    if (relative > worst) worst = relative, worst_name = name;
    EXPECT_NEAR(got, expected, expected * 1e-3) << name << " (layer " << expected_layer(name, model.depth) << ")";
  }
  std::cout << "effective lr at step " << chosen << " vs lr x decay^(L+1-layer), " << named.size()
            << " parameters: max relative |d| " << worst << " (" << worst_name << ")\n";
}

TEST(FinetuneLayerDecay, EveryParametersEffectiveLrAtAChosenStepIsTheFormula) {
  check_effective_lr(torch::kFloat32);  // the fused CPU update
}

TEST(FinetuneLayerDecay, TheWholeBufferUpdateAppliesTheSameScales) {
  check_effective_lr(torch::kFloat64);  // the tensor-operation update (what CUDA runs)
}

TEST(FinetuneLayerDecay, OffIsBitIdenticalToNoScale) {
  auto run = [](bool with_scale) {
    torch::manual_seed(5);
    VisionTransformer net(layered_model());
    std::vector<std::pair<std::string, torch::Tensor>> named;
    for (const auto& p : net->named_parameters()) named.emplace_back(p.key(), p.value());
    LrScale scale;
    if (with_scale) scale = [](const std::string& name) { return layer_decay_scale(name, 3, 1.0); };
    FlatAdamW optimizer(named, TrainConfig{}, scale);
    torch::manual_seed(6);
    for (int step = 0; step < 3; ++step) {
      optimizer.grads().copy_(torch::randn_like(optimizer.grads()));
      optimizer.step(1e-3);
    }
    return optimizer.params().clone();
  };
  EXPECT_TRUE(torch::equal(run(false), run(true)));
}

// ---- through `vit train` ----

// A config for the 4-class IDX set of test_util (class names "0" .. "9"), with `train` and `data` overrides.
std::string write_config(const std::string& dir, const std::string& data_root, const json& train = json::object(),
                         const json& data = json::object()) {
  json t{{"epochs", 2},  {"batch_size", 16}, {"lr", 2e-3},         {"warmup_steps", 3}, {"log_interval", 5},
         {"threads", 2}, {"seed", 7},        {"checkpoint_interval", 5}, {"output_root", dir + "/runs"}};
  t.update(train);
  json d{{"format", "mnist"}, {"root", data_root}, {"mean", {0.5}}, {"std", {0.5}}, {"num_workers", 2}};
  d.update(data);
  json doc{{"model", to_json(test::tiny_vit(16, 4, 1, 10, 32, 2, 2, 2.0))}, {"data", d}, {"train", t}};
  doc["model"]["drop_path_rate"] = 0.1;  // dropout: exact resume needs the saved RNG stream
  const std::string path = dir + "/config.json";
  std::ofstream(path) << doc.dump(2);
  return path;
}

// A model file to fine-tune from: the config's architecture, seeded weights.
std::string write_init(const test::TempDir& dir, int64_t num_classes = 10) {
  torch::manual_seed(11);
  VisionTransformer net(test::tiny_vit(16, 4, 1, num_classes, 32, 2, 2, 2.0));
  const std::string path = dir.file("init.safetensors");
  save_model(path, net, Preprocess{}, numbered_classes(num_classes));
  return path;
}

TEST(FinetuneLayerDecay, TrainAppliesItToEveryParameter) {
  // One step from a known start at the peak lr, no decay, no clipping: Adam's first step moves each element by
  // lr_eff * g / (|g| + eps), i.e. by lr_eff wherever the gradient is not tiny, so the median |change| is lr_eff.
  test::TempDir dir;
  test::write_idx_dataset(dir.file("data"), 256, 64);
  const std::string init = write_init(dir);
  const double lr = 1e-2, decay = 0.5;
  const auto config = write_config(dir.path(), dir.file("data"),
                                   {{"lr", lr}, {"warmup_steps", 0}, {"max_steps", 1}, {"weight_decay", 0.0},
                                    {"clip_grad", 0.0}, {"layer_decay", decay}, {"epochs", 1}});
  const auto result = test::run_vit("train --config " + test::quoted(config) + " --init-from " + test::quoted(init) +
                                    " --out " + test::quoted(dir.file("run")));
  ASSERT_EQ(result.status, 0) << result.errors;
  EXPECT_NE(result.errors.find("train.layer_decay 0.5"), std::string::npos) << result.errors;
  const auto a = safetensors::read(init), b = safetensors::read(dir.file("run/last.safetensors"));
  int checked = 0;
  for (const auto& info : a.tensors) {
    const auto moved = (a.tensor(info) - b.tensor(info.name)).abs().flatten();
    const double expected = lr * std::pow(decay, 3.0 - static_cast<double>(expected_layer(info.name, 2)));
    EXPECT_NEAR(moved.median().item<double>(), expected, expected * 0.01) << info.name;
    ++checked;
  }
  EXPECT_GT(checked, 20);
}

TEST(FinetuneFreeze, PrefixesMatchWholeComponentsAndUnknownOnesFail) {
  VisionTransformer net(test::tiny_vit(16, 4, 1, 10, 32, 2, 2, 2.0));
  auto named_of = [&] {
    std::vector<std::pair<std::string, torch::Tensor>> named;
    for (const auto& p : net->named_parameters()) named.emplace_back(p.key(), p.value());
    return named;
  };
  auto frozen = freeze_parameters(named_of(), {"blocks.1", "pos_embed"});
  EXPECT_TRUE(std::find(frozen.begin(), frozen.end(), "pos_embed") != frozen.end());
  for (const auto& name : frozen) EXPECT_TRUE(name == "pos_embed" || name.rfind("blocks.1.", 0) == 0) << name;
  EXPECT_FALSE(net->named_parameters()["blocks.1.mlp.fc1.weight"].requires_grad());
  EXPECT_TRUE(net->named_parameters()["blocks.0.mlp.fc1.weight"].requires_grad());
  for (auto& p : net->parameters()) p.requires_grad_(true);

  frozen = freeze_parameters(named_of(), {"backbone"});
  for (const auto& p : net->named_parameters()) EXPECT_EQ(p.value().requires_grad(), p.key().rfind("head.", 0) == 0);
  for (auto& p : net->parameters()) p.requires_grad_(true);

  EXPECT_NE(test::error_of([&] { freeze_parameters(named_of(), {"blocks.7"}); })
                .find("train.freeze: \"blocks.7\" matches no parameter"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { freeze_parameters(named_of(), {"block"}); }).find("\"block\" matches no"),
            std::string::npos);  // a prefix of a component is not a match
  EXPECT_NE(test::error_of([&] { freeze_parameters(named_of(), {"backbone", "head"}); }).find("nothing is left"),
            std::string::npos);
}

TEST(FinetuneFreeze, LinearProbeKeepsTheBackboneBitIdenticalWithNoOptimizerState) {
  test::TempDir dir;
  test::write_idx_dataset(dir.file("data"), 256, 64);
  const std::string init = write_init(dir);
  const auto config = write_config(dir.path(), dir.file("data"), {{"freeze", {"backbone"}}, {"ema_decay", 0.9}});
  const auto result = test::run_vit("train --config " + test::quoted(config) + " --init-from " + test::quoted(init) +
                                    " --out " + test::quoted(dir.file("run")));
  ASSERT_EQ(result.status, 0) << result.errors;
  const auto a = safetensors::read(init);
  int64_t head_values = 0;
  for (const char* file : {"last.safetensors", "ema.safetensors"}) {
    const auto b = safetensors::read(dir.file("run/") + file);
    for (const auto& info : a.tensors) {
      const bool head = info.name.rfind("head.", 0) == 0;
      EXPECT_EQ(torch::equal(a.tensor(info), b.tensor(info.name)), !head) << file << ": " << info.name;
      if (head && std::string(file) == "last.safetensors") head_values += a.tensor(info).numel();
    }
  }
  const auto state = safetensors::read(dir.file("run/state.safetensors"));
  EXPECT_EQ(state.tensor("optimizer.exp_avg").numel(), head_values);  // no state for frozen weights
  EXPECT_EQ(state.tensor("ema").numel(), head_values);
  EXPECT_NE(result.errors.find("tensors frozen"), std::string::npos) << result.errors;
}

TEST(FinetuneFreeze, AFrozenRunResumesBitIdenticallyAfterSigkill) {
  test::TempDir dir;
  test::write_idx_dataset(dir.file("data"), 1024, 64);
  const std::string init = write_init(dir);
  const auto config = write_config(dir.path(), dir.file("data"), {{"freeze", {"patch_embed", "blocks.0"}}});
  const std::string args = "train --config " + test::quoted(config) + " --init-from " + test::quoted(init);
  const auto straight = test::run_vit(args + " --out " + test::quoted(dir.file("straight")));
  ASSERT_EQ(straight.status, 0) << straight.errors;

  const std::string interrupted = dir.file("interrupted");
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string command = "exec " + test::quoted(VIT_BINARY) + " " + args + " --out " +
                                test::quoted(interrupted) + " >/dev/null 2>&1";
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!fs::exists(interrupted + "/state.safetensors") && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  const auto resumed = test::run_vit("train --resume " + test::quoted(interrupted));
  ASSERT_EQ(resumed.status, 0) << resumed.errors;
  const auto a = safetensors::read(dir.file("straight/last.safetensors"));
  const auto b = safetensors::read(interrupted + "/last.safetensors");
  const auto start = safetensors::read(init);
  for (const auto& info : a.tensors) {
    EXPECT_TRUE(torch::equal(a.tensor(info), b.tensor(info.name))) << info.name;
    const bool frozen = info.name.rfind("patch_embed.", 0) == 0 || info.name.rfind("blocks.0.", 0) == 0;
    EXPECT_EQ(torch::equal(a.tensor(info), start.tensor(info.name)), frozen) << info.name;
  }
}

TEST(FinetuneFreeze, AnUnknownPrefixStopsTrainWithItsName) {
  test::TempDir dir;
  test::write_idx_dataset(dir.file("data"), 64, 16);
  const auto config = write_config(dir.path(), dir.file("data"), {{"freeze", {"blocks.5"}}});
  const auto result = test::run_vit("train --config " + test::quoted(config) + " --out " + test::quoted(dir.file("r")));
  EXPECT_NE(result.status, 0);
  EXPECT_NE(result.errors.find("\"blocks.5\" matches no parameter"), std::string::npos) << result.errors;
}

// ---- data.classes and data.train_per_class ----

TEST(FinetuneData, ClassesAreSelectedAndRelabelledInEverySplit) {
  test::TempDir dir;
  test::write_idx_dataset(dir.file("data"), 400, 100);
  DataConfig all = test::dataset_config("mnist", dir.file("data"));
  DataConfig chosen = all;
  chosen.classes = {"3", "1"};
  const Splits a = open_datasets(all, 1, {}), b = open_datasets(chosen, 1, {});
  EXPECT_EQ(b.train->class_names(), (std::vector<std::string>{"3", "1"}));
  for (const auto& [full, part] : {std::pair{a.train, b.train}, std::pair{a.val, b.val}}) {
    std::vector<int64_t> originals;
    for (int64_t i = 0; i < full->size(); ++i) {
      if (full->label(i) == 3 || full->label(i) == 1) originals.push_back(i);
    }
    ASSERT_EQ(part->size(), static_cast<int64_t>(originals.size()));
    for (int64_t i = 0; i < part->size(); ++i) {
      const int64_t original = full->label(originals[i]);
      EXPECT_EQ(part->label(i), original == 3 ? 0 : 1);
      EXPECT_EQ(part->get(i).label, part->label(i));
      EXPECT_EQ(part->source(i), full->source(originals[i]));
    }
  }
  chosen.classes = {"7"};  // a class of the list ("0".."9") with no samples is fine; an unknown one is not
  EXPECT_EQ(open_datasets(chosen, 1, {}).train->size(), 0);
  chosen.classes = {"Bag"};
  EXPECT_NE(test::error_of([&] { open_datasets(chosen, 1, {}); })
                .find("data.classes: \"Bag\" is neither a class of the dataset nor an index below 10"),
            std::string::npos);
}

TEST(FinetuneData, TrainPerClassCapsEachClassBySeedAfterTheValSplit) {
  test::TempDir dir;
  test::write_idx_dataset(dir.file("data"), 400, 100);
  DataConfig config = test::dataset_config("mnist", dir.file("data"));
  config.val_fraction = 0.25;
  config.train_per_class = 10;
  const Splits splits = open_datasets(config, 1, {});
  std::map<int64_t, int> per_class;
  for (int64_t i = 0; i < splits.train->size(); ++i) ++per_class[splits.train->label(i)];
  EXPECT_EQ(per_class.size(), 4u);
  for (const auto& [label, count] : per_class) EXPECT_EQ(count, 10) << label;
  EXPECT_EQ(splits.val->size(), 100);  // the held-out part is not capped
  const Splits again = open_datasets(config, 1, {}), other = open_datasets(config, 2, {});
  std::vector<std::string> a, b, c;
  for (int64_t i = 0; i < splits.train->size(); ++i) {
    a.push_back(splits.train->source(i)), b.push_back(again.train->source(i)), c.push_back(other.train->source(i));
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // No training sample is also a validation sample.
  for (int64_t i = 0; i < splits.val->size(); ++i) {
    EXPECT_TRUE(std::find(a.begin(), a.end(), splits.val->source(i)) == a.end());
  }
}

TEST(FinetuneData, ConfigAcceptsNamesAndIndicesAndRejectsDuplicates) {
  const Config c = parse_config(json::parse(R"({"data": {"classes": [5, "Bag"], "train_per_class": 100}})"), "c.json");
  EXPECT_EQ(c.data.classes, (std::vector<std::string>{"5", "Bag"}));
  EXPECT_EQ(test::error_of([] { parse_config(json::parse(R"({"data": {"classes": [1.5]}})"), "c.json"); }),
            "c.json: data.classes: [1.5] is not an array of strings");
  EXPECT_EQ(test::error_of([] { parse_config(json::parse(R"({"data": {"classes": [2, "2"]}})"), "c.json"); }),
            "c.json: data.classes: \"2\" is listed twice");
  EXPECT_EQ(test::error_of([] { parse_config(json::parse(R"({"train": {"layer_decay": 0}})"), "c.json"); }),
            "c.json: train.layer_decay: 0 is out of range (0, 1]");
}

}  // namespace
}  // namespace vit
