// The trainer's parts: the resume state file (its format checks, and files written before the current version),
// the fp16 loss scaler, the scoped weight swap for EMA evaluation, the run directory and the history's text forms.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "test_util.h"
#include "train/history.h"
#include "train/loss_scaler.h"
#include "train/optimizer.h"
#include "train/run_dir.h"
#include "train/run_state.h"
#include "util/fs.h"

namespace vit {
namespace {
using nlohmann::json;
using test::error_of;

RunState sample_state() {
  RunState s;
  s.epoch = 2, s.step_in_epoch = 5, s.global_step = 37, s.epoch_loss_sum = 1.25, s.epoch_loss_count = 5;
  s.epoch_seconds = 3.5, s.epoch_images = 640, s.best_top1 = 71.5, s.elapsed_seconds = 99.0;
  s.seconds_to_target = 42.0, s.metrics_bytes = 1234, s.loss_scale = 32768.0, s.good_steps = 17;
  EpochRecord r;
  r.epoch = 1, r.train_loss = 2.0, r.eval_loss = std::nan(""), r.eval_top1 = std::nan(""), r.lr = 1e-3;
  s.history = {r};
  return s;
}

TEST(RunStateFile, RoundTripKeepsTensorsAndProgress) {
  test::TempDir dir;
  const auto params = torch::arange(6, torch::kFloat32);
  write_run_state(dir.file("state.safetensors"), {{"params", params}}, sample_state(), 2);
  const SavedRun saved = read_run_state(dir.file("state.safetensors"));
  EXPECT_TRUE(torch::equal(saved.tensor("params"), params));
  EXPECT_EQ(saved.world_size, 2);
  EXPECT_EQ(to_json(saved.state).dump(), to_json(sample_state()).dump());
  EXPECT_TRUE(std::isnan(saved.state.history[0].eval_top1));  // NaN -> null -> NaN
  EXPECT_EQ(saved.archive.metadata.at("format_version"), "1");
  EXPECT_EQ(error_of([&] { saved.tensor("ema"); }), dir.file("state.safetensors") + ": missing tensor ema");
}

// The progress JSON exactly as the first version of the trainer wrote it ("seconds_to_90", before target_top1):
// a run started then must still resume.
TEST(RunStateFile, ReadsTheFirstVersionsProgress) {
  test::TempDir dir;
  const json first_version = json::parse(R"({"epoch": 1, "step_in_epoch": 18, "global_step": 50,
      "epoch_loss_sum": 40.5, "epoch_loss_count": 18, "epoch_seconds": 2.5, "epoch_images": 576, "best_top1": 60.0,
      "elapsed_seconds": 12.0, "seconds_to_90": -1.0, "metrics_bytes": 900, "loss_scale": 65536.0,
      "good_steps": 0, "history": [{"epoch": 1, "train_loss": 2.1, "eval_loss": 1.9, "eval_top1": 60.0,
      "eval_top5": 95.0, "lr": 0.001, "epoch_seconds": 4.0, "img_per_s": 800.0}]})");
  safetensors::write(dir.file("old.safetensors"), {{"params", torch::zeros({3})}},
                     {{"format", "vit-train-state"}, {"format_version", "1"}, {"state", first_version.dump()},
                      {"world_size", "1"}});
  const SavedRun saved = read_run_state(dir.file("old.safetensors"));
  EXPECT_EQ(saved.state.global_step, 50);
  EXPECT_EQ(saved.state.seconds_to_target, -1.0);
  EXPECT_EQ(saved.state.metrics_bytes, 900u);
  ASSERT_EQ(saved.state.history.size(), 1u);
  EXPECT_EQ(saved.state.history[0].eval_top5, 95.0);
}

TEST(RunStateFile, OtherFilesAndVersionsFailNamingTheFile) {
  test::TempDir dir;
  const std::string model = dir.file("model.safetensors"), newer = dir.file("newer.safetensors");
  safetensors::write(model, {{"params", torch::zeros({3})}}, {{"format", "vit-model"}});
  EXPECT_EQ(error_of([&] { read_run_state(model); }),
            model + ": not a vit training state (metadata format \"vit-model\", expected \"vit-train-state\")");
  safetensors::write(newer, {{"params", torch::zeros({3})}},
                     {{"format", "vit-train-state"}, {"format_version", "2"}, {"state", "{}"}});
  const std::string error = error_of([&] { read_run_state(newer); });
  EXPECT_EQ(error.rfind(newer + ": training state format_version \"2\"; this vit reads version 1", 0), 0u) << error;
  safetensors::write(newer, {{"params", torch::zeros({3})}},
                     {{"format", "vit-train-state"}, {"format_version", "1"}, {"state", R"({"epoch": 1})"}});
  EXPECT_EQ(error_of([&] { read_run_state(newer); }),
            newer + ": training state: \"step_in_epoch\" is missing (a damaged state file: resume from a copy, or "
                    "start again with --init-from)");
}

// Every missing or mistyped progress field is named, down to one history record's.
TEST(RunStateFile, EachMissingOrMistypedKeyIsNamed) {
  const json good = to_json(sample_state());
  for (const auto& item : good.items()) {
    if (item.key() == "history") continue;
    json missing = good;
    missing.erase(item.key());
    EXPECT_NE(error_of([&] { run_state_from_json(missing, "s"); }).find("s: training state: \"" + item.key() +
                                                                         "\" is missing"),
              std::string::npos)
        << item.key();
    json mistyped = good;
    mistyped[item.key()] = "7";
    EXPECT_NE(error_of([&] { run_state_from_json(mistyped, "s"); }).find("\"" + item.key() + "\" is \"7\", not "),
              std::string::npos)
        << item.key();
  }
  json fractional = good;
  fractional["global_step"] = 1.5;
  EXPECT_NE(error_of([&] { run_state_from_json(fractional, "s"); }).find("\"global_step\" is 1.5, not an integer"),
            std::string::npos);
  ASSERT_FALSE(good["history"].empty());
  json record = good;
  record["history"][0].erase("train_loss");
  EXPECT_NE(error_of([&] { run_state_from_json(record, "s"); }).find("history[0]: \"train_loss\" is missing"),
            std::string::npos)
      << error_of([&] { run_state_from_json(record, "s"); });
  json listless = good;
  listless["history"] = 3;
  EXPECT_NE(error_of([&] { run_state_from_json(listless, "s"); }).find("\"history\" is 3, not a list"),
            std::string::npos);
  EXPECT_NE(error_of([&] { run_state_from_json(json::array(), "s"); }).find("is array, not an object"),
            std::string::npos);
}

TEST(LossScaler, FollowsGradScalersDefaults) {
  LossScaler scaler(/*enabled=*/true);
  EXPECT_EQ(scaler.scale(), 65536.0);
  EXPECT_FALSE(scaler.update(/*finite=*/false));  // overflow: skip and halve
  EXPECT_EQ(scaler.scale(), 32768.0);
  for (int i = 0; i < LossScaler::kGrowthInterval - 1; ++i) EXPECT_TRUE(scaler.update(true));
  EXPECT_EQ(scaler.scale(), 32768.0);
  EXPECT_TRUE(scaler.update(true));  // the 2000th good step doubles it
  EXPECT_EQ(scaler.scale(), 65536.0);
  EXPECT_EQ(scaler.good_steps(), 2000);

  LossScaler off(/*enabled=*/false);
  EXPECT_EQ(off.scale(), 1.0);
  EXPECT_TRUE(off.update(false));  // bf16/float32: nothing is skipped here (the trainer stops on divergence)
  EXPECT_EQ(off.raw_scale(), 65536.0);
}

TEST(ScopedWeights, SwapsInForTheScopeAndRestoresBitExactly) {
  torch::Tensor params = torch::randn({10});
  const torch::Tensor live = params.clone(), ema = torch::randn({10});
  {
    ScopedWeights swap(params, ema);
    EXPECT_TRUE(torch::equal(params, ema));
  }
  EXPECT_TRUE(torch::equal(params, live));
  const auto* storage = params.data_ptr();
  {
    ScopedWeights same(params, params);  // the live weights themselves: nothing copied
    EXPECT_TRUE(torch::equal(params, live));
  }
  EXPECT_EQ(params.data_ptr(), storage);
}

TEST(RunDirectory, WritesConfigMetricsSummaryAndTheLatestLink) {
  test::TempDir dir;
  Config config;
  config.train.output_root = dir.file("runs");
  const std::string run = dir.file("runs/" + new_run_name("demo"));
  {
    RunDirectory directory(run, /*writer=*/true, config, std::nullopt);
    directory.append_metrics({{"step", 1}});
    directory.append_metrics({{"step", 2}});
    EXPECT_EQ(directory.metrics_bytes(), read_file(run + "/metrics.jsonl").size());
    EpochRecord record;
    record.epoch = 1, record.train_loss = 0.5, record.eval_loss = std::nan("");
    directory.write_summary({record});
  }
  EXPECT_EQ(load_config(run + "/config.json").train.output_root, config.train.output_root);
  EXPECT_EQ(read_file(run + "/metrics.jsonl"), "{\"step\":1}\n{\"step\":2}\n");
  EXPECT_EQ(read_file(run + "/summary.csv"),
            "epoch,train_loss,eval_loss,eval_top1,eval_top5,lr,epoch_seconds,img_per_s\n1,0.5,,0,0,0,0,0\n");
  EXPECT_EQ(std::filesystem::read_symlink(dir.file("runs/latest")), std::filesystem::path(run).filename());
  // A resumed run drops the metrics lines written after its saved state.
  RunDirectory resumed(run, /*writer=*/true, config, /*resume_metrics_bytes=*/11);
  EXPECT_EQ(read_file(run + "/metrics.jsonl"), "{\"step\":1}\n");
  // Other ranks write nothing.
  RunDirectory other(dir.file("elsewhere"), /*writer=*/false, config, std::nullopt);
  EXPECT_FALSE(file_exists(dir.file("elsewhere")));
}

TEST(History, JsonKeepsNanAsNullAndCurvesFollowTheRecords) {
  EpochRecord a, b;
  a.epoch = 1, a.train_loss = 2.0, a.eval_loss = std::nan(""), a.eval_top1 = std::nan(""), a.eval_top5 = 50.0;
  b.epoch = 2, b.train_loss = 1.0, b.eval_loss = 0.9, b.eval_top1 = 70.0, b.eval_top5 = 90.0;
  const std::string text = to_json(a).dump();
  EXPECT_NE(text.find("\"eval_loss\":null"), std::string::npos) << text;
  EXPECT_TRUE(std::isnan(epoch_record_from_json(json::parse(text)).eval_loss));
  EXPECT_EQ(epoch_record_from_json(to_json(b)).eval_top1, 70.0);
  const auto panels = history_curves({a, b});
  ASSERT_EQ(panels.size(), 2u);
  EXPECT_EQ(panels[0].title, "loss");
  EXPECT_EQ(panels[0].curves[0].values, (std::vector<double>{2.0, 1.0}));
  EXPECT_EQ(panels[1].curves[1].values, (std::vector<double>{50.0, 90.0}));
}

}  // namespace
}  // namespace vit
