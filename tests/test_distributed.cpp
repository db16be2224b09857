// Multi-process training on loopback (and across two network namespaces when root): c10d collectives, N ranks x
// batch b == 1 rank x batch N*b, sharding, rank-0-only files, collective stop and exact resume, failure within the
// timeout, and `vit launch` (environment, prefixes, signal forwarding, failure propagation).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <map>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "data/loader.h"
#include "io/safetensors.h"
#include "model/vit.h"
#include "test_util.h"
#include "train/distributed.h"
#include "train/optimizer.h"
#include "train/trainer.h"
#include "vit/build_config.h"

extern char** environ;

namespace vit {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

ModelConfig tiny_model() {
  return test::tiny_vit(/*img=*/16, /*patch=*/4, /*in_chans=*/1, /*num_classes=*/10, /*embed_dim=*/32, /*depth=*/2,
                        /*num_heads=*/2, /*mlp_ratio=*/2.0);
}

// A tiny-model config; `dropout` turns on the per-rank random streams (attention dropout, drop-path).
std::string write_config(const std::string& path, const std::string& data_root, const json& train_overrides,
                         bool dropout) {
  ModelConfig m = tiny_model();
  if (dropout) m.attn_drop_rate = m.drop_path_rate = 0.1;
  json train{{"epochs", 2},          {"batch_size", 8},    {"lr", 2e-3},         {"warmup_steps", 3},
             {"label_smoothing", 0.1}, {"log_interval", 4}, {"checkpoint_interval", 5}, {"threads", 1},
             {"seed", 5},            {"dist_timeout_s", 20}, {"output_root", "runs"}, {"device", "cpu"}};
  train.update(train_overrides);
  json doc{{"model", to_json(m)},
           {"data",
            {{"format", "mnist"}, {"root", data_root}, {"mean", {0.5}}, {"std", {0.5}}, {"num_workers", 1},
             {"augment", {{"pad_crop", 2}, {"hflip", 0.5}}}}},  // per-sample augmentation is rank-independent
           {"train", train}};
  std::ofstream(path) << doc.dump(2);
  return path;
}

// A `vit` process with extra environment variables and its own working directory; output goes to files.
class VitProcess {
 public:
  VitProcess(const std::vector<std::string>& arguments, const std::vector<std::string>& environment,
             const std::string& directory, const std::string& log_stem)
      : out_path_(log_stem + ".out"), err_path_(log_stem + ".err") {
    std::vector<std::string> args{VIT_BINARY};
    args.insert(args.end(), arguments.begin(), arguments.end());
    // The job's variables come only from `environment`, never from whatever ran the tests.
    std::vector<std::string> env;
    for (char** entry = environ; *entry != nullptr; ++entry) {
      const std::string item = *entry;
      bool ours = false;
      for (const char* key : {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "MASTER_ADDR=", "MASTER_PORT=",
                              "LOCAL_WORLD_SIZE=", "GLOO_SOCKET_IFNAME="}) {
        ours = ours || item.rfind(key, 0) == 0;
      }
      if (!ours) env.push_back(item);
    }
    env.insert(env.end(), environment.begin(), environment.end());
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    for (auto& e : env) envp.push_back(e.data());
    argv.push_back(nullptr);
    envp.push_back(nullptr);
    std::cout.flush();
    std::fflush(nullptr);  // else the child's freopen would write our buffered output a second time
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);  // its own process group: a test's signals reach only what it means to signal
      if (::chdir(directory.c_str()) != 0) ::_exit(126);
      if (!::freopen(out_path_.c_str(), "w", stdout) || !::freopen(err_path_.c_str(), "w", stderr)) ::_exit(126);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
  }
  ~VitProcess() {
    if (!status_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  // The wait status once it ended within `seconds`, else nullopt (still running).
  std::optional<int> wait_for(double seconds) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    while (!status_) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        status_ = status;
        break;
      }
      if (Clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return status_;
  }
  // Exit code (128 + signal when killed); fails the test when it has not ended within `seconds`.
  int finish(double seconds = 120) {
    const auto status = wait_for(seconds);
    if (!status) {
      ADD_FAILURE() << "vit pid " << pid_ << " still running after " << seconds << " s; stderr:\n" << errors();
      return -1;
    }
    return WIFEXITED(*status) ? WEXITSTATUS(*status) : 128 + WTERMSIG(*status);
  }
  std::string output() const { return slurp(out_path_); }
  std::string errors() const { return slurp(err_path_); }

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
  std::string out_path_, err_path_;
};

std::vector<std::string> rank_environment(int rank, int world_size, int port, const std::string& addr = "127.0.0.1") {
  return {"RANK=" + std::to_string(rank), "LOCAL_RANK=" + std::to_string(rank),
          "WORLD_SIZE=" + std::to_string(world_size), "MASTER_ADDR=" + addr, "MASTER_PORT=" + std::to_string(port)};
}

bool wait_for_file(const std::string& path, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (!fs::exists(path)) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// The ranks `vit launch` started, by RANK (read from each child's environment).
std::map<int, pid_t> launched_ranks(pid_t launcher, int expected, double seconds = 60) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  std::map<int, pid_t> ranks;
  while (static_cast<int>(ranks.size()) < expected && Clock::now() < deadline) {
    std::ifstream children("/proc/" + std::to_string(launcher) + "/task/" + std::to_string(launcher) + "/children");
    for (pid_t pid; children >> pid;) {
      std::istringstream environment(slurp("/proc/" + std::to_string(pid) + "/environ"));
      for (std::string variable; std::getline(environment, variable, '\0');) {
        if (variable.rfind("RANK=", 0) == 0) ranks[std::stoi(variable.substr(5))] = pid;
      }
    }
    if (static_cast<int>(ranks.size()) < expected) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return ranks;
}

double max_weight_difference(const std::string& a_path, const std::string& b_path, bool* same_names) {
  const auto a = safetensors::read(a_path);
  const auto b = safetensors::read(b_path);
  double worst = 0.0;
  *same_names = a.tensors.size() == b.tensors.size();
  for (const auto& info : a.tensors) {
    if (b.find(info.name) == nullptr) {
      *same_names = false;
      continue;
    }
    worst = std::max(worst, test::max_abs_diff(a.tensor(info), b.tensor(info.name)));
  }
  return worst;
}

std::vector<json> metrics_lines(const std::string& path) {
  std::vector<json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(json::parse(line));
  }
  return lines;
}

// ---- collectives, in one process: two ranks on two threads ----

using test::with_two_ranks;

TEST(DistComm, BucketedMeanBroadcastAndScalarSums) {
  SKIP_WITHOUT_C10D();
  // 1000 floats in buckets of 64 floats: 16 all-reduces in flight at once, the last one short.
  const auto base = torch::arange(1000, torch::kFloat32);
  std::vector<torch::Tensor> means(2), broadcasts(2);
  std::vector<std::vector<double>> sums(2);
  with_two_ranks([&](Communicator& comm) {
    const int r = comm.rank();
    auto flat = base * static_cast<float>(r + 1);  // rank 0: x, rank 1: 2x; mean 1.5x
    test::all_reduce_mean(comm, flat, /*bucket_bytes=*/64 * 4);
    means[r] = flat;
    std::vector<torch::Tensor> params{torch::full({5}, static_cast<float>(r + 10))};
    comm.broadcast(params, 0);
    broadcasts[r] = params[0];
    sums[r] = sum_over_ranks(comm, {0.25 * (r + 1), r == 1 ? 1.0 : 0.0});
    comm.barrier();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(torch::allclose(means[r], base * 1.5f)) << "rank " << r;
    EXPECT_TRUE(torch::equal(broadcasts[r], torch::full({5}, 10.0f))) << "rank " << r;
    EXPECT_EQ(sums[r], (std::vector<double>{0.75, 1.0})) << "rank " << r;
  }
}

TEST(DistComm, OverlappedReducerAveragesLikeAPlainAllReduce) {
  SKIP_WITHOUT_C10D();
  std::vector<torch::Tensor> local(2), reduced(2);
  std::vector<int64_t> buckets(2), early(2);
  with_two_ranks([&](Communicator& comm) {
    const int r = comm.rank();
    torch::manual_seed(1);
    VisionTransformer net(tiny_model());
    std::vector<std::pair<std::string, torch::Tensor>> named;
    for (const auto& p : net->named_parameters()) named.emplace_back(p.key(), p.value());
    FlatAdamW optimizer(named, TrainConfig{});
    // 4 KiB buckets: a dozen of them, so most can start while backward is still running.
    GradientReducer reducer(comm, optimizer.grads(), optimizer.named(), named, /*bucket_bytes=*/4096);
    torch::manual_seed(10 + r);
    const auto x = torch::randn({4, 1, 16, 16});
    const auto y = torch::randint(0, 10, {4});
    optimizer.zero_grad();
    classification_loss(net->forward(x), y, {}, 0.0).backward();  // not armed: hooks stay quiet
    local[r] = optimizer.grads().clone();
    optimizer.zero_grad();
    reducer.arm();
    classification_loss(net->forward(x), y, {}, 0.0).backward();
    reducer.finish();
    reduced[r] = optimizer.grads().clone();
    buckets[r] = reducer.buckets();
    early[r] = reducer.started_during_backward();
  });
  const auto expected = (local[0] + local[1]) / 2;
  for (int r = 0; r < 2; ++r) {
    EXPECT_LT(test::max_abs_diff(reduced[r], expected), 1e-7) << "rank " << r;
    EXPECT_GT(buckets[r], 4) << "rank " << r;
    EXPECT_GT(early[r], 0) << "no bucket started during backward on rank " << r;
    std::cout << "rank " << r << ": " << early[r] << " of " << buckets[r] << " buckets started during backward\n";
  }
  EXPECT_TRUE(torch::equal(reduced[0], reduced[1]));
}

TEST(DistComm, WorldOfOneIsANoOpAndEnvironmentIsChecked) {
  auto comm = make_local_communicator();
  auto flat = torch::ones({7});
  test::all_reduce_mean(*comm, flat);
  EXPECT_TRUE(torch::equal(flat, torch::ones({7})));
  EXPECT_EQ(sum_over_ranks(*comm, {2.5, 1.0}), (std::vector<double>{2.5, 1.0}));
  EXPECT_EQ(local_address_towards("127.0.0.1"), "127.0.0.1");

  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("RANK", "2", 1);
  try {
    dist_env_from_environment();
    ADD_FAILURE() << "RANK=2 of WORLD_SIZE=2 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("RANK=2 is not in [0, WORLD_SIZE=2)"), std::string::npos) << e.what();
  }
  ::setenv("RANK", "one", 1);
  EXPECT_THROW(dist_env_from_environment(), std::invalid_argument);
  ::unsetenv("WORLD_SIZE");
  ::unsetenv("RANK");
  EXPECT_EQ(dist_env_from_environment().world_size, 1);
}

// ---- sharding ----

class IndexDataset : public Dataset {
 public:
  explicit IndexDataset(int64_t count) : count_(count) {}
  int64_t size() const override { return count_; }
  Sample get(int64_t index) const override {
    return {RawImage{1, 1, 1, {static_cast<uint8_t>(index % 251)}}, index % 10};
  }
  std::string source(int64_t index) const override {
    std::string text = "#";  // appended: GCC 12 (C++20) warns falsely on "#" + std::string&&
    text += std::to_string(index);
    return text;
  }
  int64_t label(int64_t index) const override { return index % 10; }
  const std::vector<std::string>& class_names() const override { return names_; }

 private:
  int64_t count_;
  std::vector<std::string> names_ = {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};
};

torch::Tensor as_pixel(ImageInput input, std::mt19937_64&) {
  const RawImage image = std::move(input).decode();
  return torch::full({1, 1, 1}, static_cast<float>(image.pixels[0]));
}

TEST(DistShard, EveryEpochCoversEachSampleOnceAcrossRanks) {
  const int64_t N = 203, B = 8, W = 2;  // 203 = 12 global batches of 16, and a tail of 11
  auto dataset = std::make_shared<IndexDataset>(N);
  for (int64_t epoch : {0, 1}) {
    std::multiset<int64_t> train_seen, eval_seen;
    std::vector<int64_t> rank_batches;
    for (int64_t rank = 0; rank < W; ++rank) {
      LoaderOptions options;
      options.batch_size = B;
      options.seed = 9;
      options.rank = rank;
      options.world_size = W;
      Loader train(dataset, as_pixel, options);
      train.start_epoch(epoch);
      int64_t batches = 0;
      while (auto batch = train.next()) {
        ++batches;
        EXPECT_EQ(batch->indices.size(), static_cast<size_t>(B));  // the tail is dropped, never padded
        train_seen.insert(batch->indices.begin(), batch->indices.end());
      }
      rank_batches.push_back(batches);
      options.shuffle = false;
      options.drop_last = false;
      Loader eval(dataset, as_pixel, options);
      eval.start_epoch(0);
      while (auto batch = eval.next()) eval_seen.insert(batch->indices.begin(), batch->indices.end());
    }
    EXPECT_EQ(rank_batches, (std::vector<int64_t>{12, 12})) << "both ranks take the same number of steps";
    EXPECT_EQ(train_seen.size(), static_cast<size_t>(N / (B * W) * B * W));
    EXPECT_EQ(std::set<int64_t>(train_seen.begin(), train_seen.end()).size(), train_seen.size())
        << "a training sample was seen twice in epoch " << epoch;
    ASSERT_EQ(eval_seen.size(), static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) EXPECT_EQ(eval_seen.count(i), 1u) << "eval sample " << i;
  }
}

// ---- training through the `vit` binary ----

TEST(DistTrain, TwoRanksOfBatch8MatchOneRankOfBatch16AndOnlyRank0Writes) {
  SKIP_WITHOUT_C10D();
  test::TempDir dir;
  test::write_idx_dataset(dir.file("data"), 256, 64);
  const json common{{"epochs", 1}, {"max_steps", 12}, {"checkpoint_interval", 0}, {"lr", 1e-3}};
  json one_rank = common, two_ranks = common;
  one_rank["batch_size"] = 16;
  two_ranks["batch_size"] = 8;
  const auto config1 = write_config(dir.file("one.json"), dir.file("data"), one_rank, /*dropout=*/false);
  const auto config2 = write_config(dir.file("two.json"), dir.file("data"), two_ranks, /*dropout=*/false);
  // Rank 1 runs in a directory of its own with the same relative --out: anything it wrote would show up there.
  for (const char* d : {"single", "rank0", "rank1"}) fs::create_directories(dir.file(d));

  VitProcess single({"train", "--config", config1, "--out", "run"}, {}, dir.file("single"), dir.file("single"));
  ASSERT_EQ(single.finish(), 0) << single.errors();

  const int port = test::free_port();
  VitProcess rank0({"train", "--config", config2, "--out", "run"}, rank_environment(0, 2, port), dir.file("rank0"),
                   dir.file("rank0"));
  VitProcess rank1({"train", "--config", config2, "--out", "run"}, rank_environment(1, 2, port), dir.file("rank1"),
                   dir.file("rank1"));
  ASSERT_EQ(rank0.finish(), 0) << rank0.errors();
  ASSERT_EQ(rank1.finish(), 0) << rank1.errors();

  bool same_names = false;
  const double diff = max_weight_difference(dir.file("single/run/last.safetensors"),
                                            dir.file("rank0/run/last.safetensors"), &same_names);
  std::cout << "2 ranks x batch 8 vs 1 rank x batch 16 after 12 steps: max |d| " << diff << "\n";
  EXPECT_TRUE(same_names);
  EXPECT_LT(diff, 1e-5);

  // The logged loss is the mean over both ranks: what the single process logs, to float precision.
  const auto single_lines = metrics_lines(dir.file("single/run/metrics.jsonl"));
  const auto dist_lines = metrics_lines(dir.file("rank0/run/metrics.jsonl"));
  ASSERT_EQ(single_lines.size(), 3u);
  ASSERT_EQ(dist_lines.size(), 3u);
  for (size_t i = 0; i < dist_lines.size(); ++i) {
    EXPECT_NEAR(dist_lines[i]["loss"].get<double>(), single_lines[i]["loss"].get<double>(), 1e-5) << i;
    EXPECT_TRUE(dist_lines[i].contains("comm_ms")) << dist_lines[i].dump();
    EXPECT_FALSE(single_lines[i].contains("comm_ms"));
  }
  // Evaluation is sharded and reduced: both ranks log rank 0's (global) numbers.
  const std::string summary = slurp(dir.file("rank0/run/summary.csv"));
  EXPECT_NE(summary.find("\n1,"), std::string::npos) << summary;

  std::vector<std::string> stray;
  for (const auto& entry : fs::recursive_directory_iterator(dir.file("rank1"))) stray.push_back(entry.path());
  EXPECT_TRUE(stray.empty()) << "rank 1 wrote " << stray.front();
  for (const char* name : {"config.json", "metrics.jsonl", "summary.csv", "last.safetensors", "best.safetensors",
                           "state.safetensors"}) {
    EXPECT_TRUE(fs::exists(dir.file("rank0/run/") + name)) << name;
  }
  EXPECT_NE(rank1.errors().find("joining the gloo group as rank 1 of 2"), std::string::npos)
      << rank1.errors();
}

TEST(DistTrain, SigtermToOneRankStopsBothAtOneStepAndResumeIsExact) {
  SKIP_WITHOUT_C10D();
  test::TempDir dir;
  test::write_idx_dataset(dir.file("data"), 512, 64);
  // Dropout on: exact resume needs every rank's own RNG stream back.
  const auto config = write_config(dir.file("config.json"), dir.file("data"), {{"epochs", 2}}, /*dropout=*/true);
  const std::vector<std::string> launch{"launch", "--nproc", "2", "--"};
  auto train_args = [&](const std::vector<std::string>& rest) {
    std::vector<std::string> args = launch;
    args.insert(args.end(), rest.begin(), rest.end());
    return args;
  };

  VitProcess straight(train_args({"train", "--config", config, "--out", dir.file("straight")}), {}, dir.path(),
                      dir.file("straight"));
  ASSERT_EQ(straight.finish(), 0) << straight.errors();

  VitProcess interrupted(train_args({"train", "--config", config, "--out", dir.file("interrupted")}), {}, dir.path(),
                         dir.file("interrupted"));
  const auto ranks = launched_ranks(interrupted.pid(), 2);
  ASSERT_EQ(ranks.size(), 2u) << interrupted.errors();
  ASSERT_TRUE(wait_for_file(dir.file("interrupted/state.safetensors"), 120)) << interrupted.errors();
  ::kill(ranks.at(1), SIGTERM);  // rank 1 only: rank 0 must learn of it and stop after the same step
  EXPECT_EQ(interrupted.finish(), 130) << interrupted.errors();
  const std::string log = interrupted.errors();
  const std::regex stopped("([01]): .*stopped at step ([0-9]+)");
  std::map<std::string, std::string> step_of_rank;
  for (std::sregex_iterator it(log.begin(), log.end(), stopped), end; it != end; ++it) {
    step_of_rank[(*it)[1]] = (*it)[2];
  }
  ASSERT_EQ(step_of_rank.size(), 2u) << log;
  EXPECT_EQ(step_of_rank["0"], step_of_rank["1"]) << log;
  EXPECT_NE(step_of_rank["0"], "64") << "the stop came after the run had ended; the test proves nothing";

  VitProcess resumed(train_args({"train", "--resume", dir.file("interrupted")}), {}, dir.path(), dir.file("resumed"));
  ASSERT_EQ(resumed.finish(), 0) << resumed.errors();
  const auto a = safetensors::read(dir.file("straight/last.safetensors"));
  const auto b = safetensors::read(dir.file("interrupted/last.safetensors"));
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& info : a.tensors) EXPECT_TRUE(torch::equal(a.tensor(info), b.tensor(info.name))) << info.name;
  const auto state_a = safetensors::read(dir.file("straight/state.safetensors"));
  const auto state_b = safetensors::read(dir.file("interrupted/state.safetensors"));
  for (const char* name : {"optimizer.exp_avg_sq", "rng.cpu.rank0", "rng.cpu.rank1"}) {
    EXPECT_TRUE(torch::equal(state_a.tensor(name), state_b.tensor(name))) << name;
  }
  EXPECT_EQ(metrics_lines(dir.file("straight/metrics.jsonl")).size(),
            metrics_lines(dir.file("interrupted/metrics.jsonl")).size());

  // A 2-rank state resumed by one process is refused by name, not silently misaligned.
  VitProcess alone({"train", "--resume", dir.file("interrupted")}, {}, dir.path(), dir.file("alone"));
  EXPECT_EQ(alone.finish(), 2);
  EXPECT_NE(alone.errors().find("was saved by 2 rank(s); resume it with WORLD_SIZE=2, not 1"), std::string::npos)
      << alone.errors();
}

// ---- failures: a dead, a stopped and a missing rank ----

TEST(DistFailure, KilledRankMakesTheOtherExitWithAMessageAndResumeContinues) {
  SKIP_WITHOUT_C10D();
  test::TempDir dir;
  test::write_idx_dataset(dir.file("data"), 1024, 64);
  const auto config = write_config(dir.file("config.json"), dir.file("data"), {{"epochs", 3}}, false);
  const int port = test::free_port();
  VitProcess rank0({"train", "--config", config, "--out", dir.file("run")}, rank_environment(0, 2, port), dir.path(),
                   dir.file("rank0"));
  VitProcess rank1({"train", "--config", config, "--out", dir.file("run")}, rank_environment(1, 2, port), dir.path(),
                   dir.file("rank1"));
  ASSERT_TRUE(wait_for_file(dir.file("run/state.safetensors"), 120)) << rank0.errors();
  ::kill(rank1.pid(), SIGKILL);
  const auto killed_at = Clock::now();
  const int status = rank0.finish(20 + 30);  // dist_timeout_s 20, plus slack for a loaded machine
  const double seconds = std::chrono::duration<double>(Clock::now() - killed_at).count();
  std::cout << "rank 0 exited " << seconds << " s after rank 1 was killed\n";
  EXPECT_EQ(status, 1) << rank0.errors();
  EXPECT_NE(rank0.errors().find("rank 0 of 2: gloo"), std::string::npos) << rank0.errors();
  EXPECT_NE(rank0.errors().find("failed (a peer died"), std::string::npos) << rank0.errors();

  // The last good state survives, and both ranks continue from it.
  const int port2 = test::free_port();
  VitProcess resume0({"train", "--resume", dir.file("run")}, rank_environment(0, 2, port2), dir.path(),
                     dir.file("resume0"));
  VitProcess resume1({"train", "--resume", dir.file("run")}, rank_environment(1, 2, port2), dir.path(),
                     dir.file("resume1"));
  EXPECT_EQ(resume0.finish(), 0) << resume0.errors();
  EXPECT_EQ(resume1.finish(), 0) << resume1.errors();
  EXPECT_NE(resume0.errors().find("resumed at epoch"), std::string::npos) << resume0.errors();
  EXPECT_EQ(slurp(dir.file("run/summary.csv")).find("\n4,"), std::string::npos);
  EXPECT_NE(slurp(dir.file("run/summary.csv")).find("\n3,"), std::string::npos);
}

// A loss that is not finite on one rank only (here: rank 1 alone runs with an absurd learning rate, so its weights
// blow up after its first update): both ranks stop at the same step with the cause, instead of the healthy rank
// waiting for a peer that died.
TEST(DistFailure, NonFiniteLossOnOneRankStopsEveryRankWithTheCause) {
  SKIP_WITHOUT_C10D();
  test::TempDir dir;
  test::write_idx_dataset(dir.file("data"), 256, 64);
  const auto config = write_config(dir.file("config.json"), dir.file("data"),
                                   {{"epochs", 1}, {"checkpoint_interval", 0}, {"clip_grad", 0}}, false);
  for (const char* d : {"rank0", "rank1"}) fs::create_directories(dir.file(d));
  const int port = test::free_port();
  VitProcess rank0({"train", "--config", config, "--out", "run"}, rank_environment(0, 2, port), dir.file("rank0"),
                   dir.file("rank0"));
  VitProcess rank1({"train", "--config", config, "--out", "run", "--set", "train.lr=1e30", "--set",
                    "train.warmup_epochs=0"},
                   rank_environment(1, 2, port), dir.file("rank1"), dir.file("rank1"));
  EXPECT_EQ(rank0.finish(), 1) << rank0.errors();
  EXPECT_EQ(rank1.finish(), 1) << rank1.errors();
  const std::regex healthy("training diverged: loss is [-a-z0-9.]+ at step ([0-9]+) \\(epoch 1\\) on 1 of 2 ranks;");
  const std::regex culprit("training diverged: loss is [-a-z]+ at step ([0-9]+) \\(epoch 1\\) on 1 of 2 ranks "
                           "\\(this one included\\);");
  std::smatch at0, at1;
  const std::string errors0 = rank0.errors(), errors1 = rank1.errors();
  ASSERT_TRUE(std::regex_search(errors0, at0, healthy)) << errors0;
  ASSERT_TRUE(std::regex_search(errors1, at1, culprit)) << errors1;
  std::cout << "rank 0: " << at0[0] << "\nrank 1: " << at1[0] << "\n";
  EXPECT_EQ(at0[1], at1[1]) << "the ranks stopped at different steps";
  EXPECT_EQ(errors0.find("peer"), std::string::npos) << errors0;
}

TEST(DistFailure, StoppedRankTimesOutInsteadOfHanging) {
  SKIP_WITHOUT_C10D();
  test::TempDir dir;
  test::write_idx_dataset(dir.file("data"), 1024, 64);
  const auto config =
      write_config(dir.file("config.json"), dir.file("data"), {{"epochs", 3}, {"dist_timeout_s", 5}}, false);
  const int port = test::free_port();
  VitProcess rank0({"train", "--config", config, "--out", dir.file("run")}, rank_environment(0, 2, port), dir.path(),
                   dir.file("rank0"));
  VitProcess rank1({"train", "--config", config, "--out", dir.file("run")}, rank_environment(1, 2, port), dir.path(),
                   dir.file("rank1"));
  ASSERT_TRUE(wait_for_file(dir.file("run/state.safetensors"), 120)) << rank0.errors();
  ::kill(rank1.pid(), SIGSTOP);  // alive, connections open, but silent: only the timeout can tell
  const auto stopped_at = Clock::now();
  const int status = rank0.finish(5 + 40);
  const double seconds = std::chrono::duration<double>(Clock::now() - stopped_at).count();
  std::cout << "rank 0 gave up " << seconds << " s after rank 1 stopped (dist_timeout_s 5)\n";
  ::kill(rank1.pid(), SIGKILL);
  EXPECT_EQ(status, 1) << rank0.errors();
  EXPECT_GE(seconds, 4.0) << rank0.errors();
  EXPECT_NE(rank0.errors().find("did not answer within train.dist_timeout_s"), std::string::npos) << rank0.errors();
}

TEST(DistFailure, MissingRankFailsTheRendezvousWithinTheTimeout) {
  SKIP_WITHOUT_C10D();
  test::TempDir dir;
  test::write_idx_dataset(dir.file("data"), 64, 16);
  const auto config = write_config(dir.file("config.json"), dir.file("data"), {{"dist_timeout_s", 3}}, false);
  const auto start = Clock::now();
  VitProcess rank0({"train", "--config", config, "--out", dir.file("run")}, rank_environment(0, 2, test::free_port()),
                   dir.path(), dir.file("rank0"));
  EXPECT_EQ(rank0.finish(3 + 40), 1) << rank0.errors();
  std::cout << "rank 0 alone gave up after " << std::chrono::duration<double>(Clock::now() - start).count()
            << " s (dist_timeout_s 3)\n";
  EXPECT_NE(rank0.errors().find("rank 0 of 2: rendezvous at 127.0.0.1:"), std::string::npos) << rank0.errors();
  EXPECT_NE(rank0.errors().find("only 1 of 2 ranks arrived"), std::string::npos) << rank0.errors();
  EXPECT_FALSE(fs::exists(dir.file("run/state.safetensors")));
}

// ---- two hosts: one rank in each of two network namespaces joined by a veth pair ----

// Creates the namespaces and the link; deletes them (and with them the link) when it dies.
class NetnsPair {
 public:
  NetnsPair()
      : a_("vit-test-" + std::to_string(::getpid()) + "-a"), b_("vit-test-" + std::to_string(::getpid()) + "-b") {
    const std::string veth_a = "vta" + std::to_string(::getpid() % 100000);
    const std::string veth_b = "vtb" + std::to_string(::getpid() % 100000);
    for (const std::string& command :
         {"ip netns add " + a_, "ip netns add " + b_,
          "ip link add " + veth_a + " type veth peer name " + veth_b,
          "ip link set " + veth_a + " netns " + a_, "ip link set " + veth_b + " netns " + b_,
          "ip -n " + a_ + " addr add 10.213.7.1/24 dev " + veth_a,
          "ip -n " + b_ + " addr add 10.213.7.2/24 dev " + veth_b,
          "ip -n " + a_ + " link set " + veth_a + " up", "ip -n " + b_ + " link set " + veth_b + " up",
          "ip -n " + a_ + " link set lo up", "ip -n " + b_ + " link set lo up"}) {
      if (std::system((command + " 2>" + log_).c_str()) != 0) {
        error_ = command + ": " + slurp(log_);
        return;
      }
    }
  }
  ~NetnsPair() {
    for (const auto& name : {a_, b_}) std::system(("ip netns delete " + name + " 2>/dev/null").c_str());
    std::remove(log_.c_str());
  }
  const std::string& error() const { return error_; }
  const std::string& a() const { return a_; }
  const std::string& b() const { return b_; }

 private:
  std::string a_, b_, error_;
  std::string log_ = (fs::temp_directory_path() / ("vit-netns-" + std::to_string(::getpid()) + ".log")).string();
};

TEST(DistNetns, RanksOnTwoHostsReachEachOtherOnlyThroughTheLink) {
  SKIP_WITHOUT_C10D();
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to create network namespaces (ip netns)";
  if (std::system("command -v ip >/dev/null 2>&1") != 0) GTEST_SKIP() << "needs iproute2's `ip`";
  NetnsPair hosts;
  if (!hosts.error().empty()) GTEST_SKIP() << "network namespaces unavailable here: " << hosts.error();

  test::TempDir dir;
  test::write_idx_dataset(dir.file("data"), 256, 64);
  const auto config = write_config(dir.file("config.json"), dir.file("data"), {{"epochs", 1}, {"max_steps", 6}}, false);
  // `ip netns exec NS vit ...`: the rank sees only its namespace's interfaces (lo and one end of the link).
  auto run_in = [&](const std::string& ns, int rank) {
    std::vector<std::string> args{"train", "--config", config, "--out", dir.file("run")};
    std::string command = "exec timeout 150 ip netns exec " + ns + " env";
    for (const auto& variable : rank_environment(rank, 2, 29517, "10.213.7.1")) command += " " + variable;
    command += std::string(" '") + VIT_BINARY + "'";
    for (const auto& a : args) command += " '" + a + "'";
    return command + " >'" + dir.file("rank" + std::to_string(rank)) + ".log' 2>&1";
  };
  std::cout.flush();
  std::fflush(nullptr);
  const pid_t rank0 = ::fork();
  if (rank0 == 0) {
    ::execl("/bin/sh", "sh", "-c", run_in(hosts.a(), 0).c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const pid_t rank1 = ::fork();
  if (rank1 == 0) {
    ::execl("/bin/sh", "sh", "-c", run_in(hosts.b(), 1).c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status0 = 0, status1 = 0;
  ::waitpid(rank0, &status0, 0);
  ::waitpid(rank1, &status1, 0);
  const std::string log0 = slurp(dir.file("rank0.log")), log1 = slurp(dir.file("rank1.log"));
  EXPECT_TRUE(WIFEXITED(status0) && WEXITSTATUS(status0) == 0) << log0;
  EXPECT_TRUE(WIFEXITED(status1) && WEXITSTATUS(status1) == 0) << log1;
  EXPECT_NE(log0.find("gloo uses 10.213.7.1"), std::string::npos) << log0;
  EXPECT_NE(log1.find("gloo uses 10.213.7.2"), std::string::npos) << log1;
  EXPECT_TRUE(fs::exists(dir.file("run/last.safetensors")));
}

}  // namespace
}  // namespace vit
