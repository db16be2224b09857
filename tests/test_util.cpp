// Shared test helpers.
#include "test_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "train/distributed.h"

namespace vit::test {

std::string config_path(const std::string& name) {
  std::string path = VIT_TEST_DATA;
  path += "/../../configs/";
  path += name;
  return path;
}

TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "vit-test-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code error;
  std::filesystem::remove_all(path_, error);
}

void write_bytes(const std::string& path, const std::string& bytes) {
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw std::runtime_error(path + ": cannot write the test file");
}

std::string quoted(const std::string& text) { return "'" + text + "'"; }

int run_vit_and_kill(const std::string& arguments, const std::string& wait_for, int signal) {
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string command = std::string("exec '") + VIT_BINARY + "' " + arguments + " >/dev/null 2>&1";
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Wait until a resume state exists and the run is some way further, then kill.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!std::filesystem::exists(wait_for) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid, signal);
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

CommandResult run_vit(const std::string& arguments, const std::string& shell_prefix) {
  TempDir scratch;
  const std::string out = scratch.file("stdout"), err = scratch.file("stderr");
  const std::string command =
      shell_prefix + "'" + VIT_BINARY + "' " + arguments + " >'" + out + "' 2>'" + err + "'";
  const int raw = std::system(command.c_str());
  CommandResult result;
  result.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  auto slurp = [](const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  result.output = slurp(out);
  result.errors = slurp(err);
  return result;
}

namespace {
std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
}  // namespace

std::string reference_python(const std::vector<std::string>& modules, std::string* why) {
  std::string python;
  if (const char* env = std::getenv("VIT_TEST_PYTHON"); env && *env) {
    python = env;
  } else if (const char* venv = std::getenv("VIT_VENV"); venv && *venv) {
    python = std::string(venv) + "/bin/python";
  } else {
    python = VIT_TEST_PYTHON;
  }
  if (::access(python.c_str(), X_OK) != 0) {
    *why = "reference libraries not installed: no " + python + " (scripts/setup.sh makes it with VIT_SETUP_TEST_EXTRAS=1)";
    return "";
  }
  std::string imports;
  for (const auto& m : modules) imports += "import " + m + "; ";
  TempDir scratch;
  const std::string command =
      test::quoted(python) + " -c " + test::quoted(imports) + " >/dev/null 2>" + test::quoted(scratch.file("err"));
  if (std::system(command.c_str()) != 0) {
    std::string error = slurp(scratch.file("err"));
    const auto last = error.find_last_not_of('\n');
    error = error.substr(0, last == std::string::npos ? 0 : last + 1);
    const auto line = error.rfind('\n');
    *why = "reference libraries not installed in " + python + ": " + (line == std::string::npos ? error : error.substr(line + 1));
    return "";
  }
  return python;
}

std::string run_python(const std::string& script, const std::string& arguments) {
  std::string why;
  const std::string python = reference_python({}, &why);
  if (python.empty()) throw std::runtime_error(why);
  TempDir scratch;
  const std::string out = scratch.file("stdout"), err = scratch.file("stderr");
  const std::string command = test::quoted(python) + " " + test::quoted(std::string(VIT_TEST_SOURCE) + "/" + script) + " " +
                              arguments + " >" + test::quoted(out) + " 2>" + test::quoted(err);
  const int raw = std::system(command.c_str());
  if (!WIFEXITED(raw) || WEXITSTATUS(raw) != 0) {
    throw std::runtime_error(script + " " + arguments + " failed:\n" + slurp(err));
  }
  return slurp(out);
}

std::string write_tiny32_config(const TempDir& dir) {
  const std::string path = dir.file("tiny32.json");
  write_bytes(path, R"({
    "model": {"img_size": 32, "patch_size": 16, "in_chans": 3, "num_classes": 10, "embed_dim": 64, "depth": 2,
              "num_heads": 2},
    "data": {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "crop_pct": 1.0}
  })");
  return path;
}

ModelConfig tiny_vit(int64_t img, int64_t patch, int64_t in_chans, int64_t num_classes, int64_t embed_dim,
                     int64_t depth, int64_t num_heads, double mlp_ratio) {
  ModelConfig m;
  m.img_h = m.img_w = img;
  m.patch_size = patch;
  m.in_chans = in_chans;
  m.num_classes = num_classes;
  m.embed_dim = embed_dim;
  m.depth = depth;
  m.num_heads = num_heads;
  m.mlp_ratio = mlp_ratio;
  return m;
}

ModelConfig input_model(int64_t H, int64_t W, int64_t C) {
  ModelConfig model;
  model.img_h = H;
  model.img_w = W;
  model.in_chans = C;
  return model;
}

DataConfig dataset_config(const std::string& format, const std::string& root) {
  DataConfig config;
  config.format = enum_from_name<DataFormat>(format).value();
  config.root = root;
  return config;
}

RawImage gradient_image(int64_t H, int64_t W, int64_t C) {
  RawImage image{H, W, C, {}};
  for (int64_t y = 0; y < H; ++y) {
    for (int64_t x = 0; x < W; ++x) {
      for (int64_t c = 0; c < C; ++c) image.pixels.push_back(static_cast<uint8_t>((y * 9 + x * 5 + c * 60) % 256));
    }
  }
  return image;
}

void write_idx_dataset(const std::string& dir, int train_count, int test_count) {
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& prefix, int count, uint32_t seed) {
    std::mt19937 rng(seed);
    std::string images, labels;
    auto be32 = [](std::string& s, uint32_t v) {
      for (int shift = 24; shift >= 0; shift -= 8) s.push_back(static_cast<char>((v >> shift) & 0xFF));
    };
    be32(images, 0x803), be32(images, count), be32(images, 16), be32(images, 16);
    be32(labels, 0x801), be32(labels, count);
    for (int i = 0; i < count; ++i) {
      const int label = static_cast<int>(rng() % 4);
      labels.push_back(static_cast<char>(label));
      for (int y = 0; y < 16; ++y) {
        for (int x = 0; x < 16; ++x) {
          const bool in_square = (y / 8) * 2 + (x / 8) == label && (y % 8) >= 2 && (y % 8) < 6 && (x % 8) >= 2 &&
                                 (x % 8) < 6;
          images.push_back(static_cast<char>((in_square ? 200 : 20 + 30 * label) + rng() % 40));
        }
      }
    }
    std::ofstream(dir + "/" + prefix + "-images-idx3-ubyte", std::ios::binary) << images;
    std::ofstream(dir + "/" + prefix + "-labels-idx1-ubyte", std::ios::binary) << labels;
  };
  write("train", train_count, 1);
  write("t10k", test_count, 2);
}

void all_reduce_mean(Communicator& comm, torch::Tensor& flat, int64_t bucket_bytes) {
  if (comm.world_size() <= 1) return;
  const int64_t per_bucket = std::max<int64_t>(1, bucket_bytes / static_cast<int64_t>(flat.element_size()));
  std::vector<torch::Tensor> buckets;
  for (int64_t start = 0; start < flat.numel(); start += per_bucket) {
    buckets.push_back(flat.narrow(0, start, std::min(per_bucket, flat.numel() - start)));
  }
  comm.all_reduce_sum(buckets);
  flat.div_(comm.world_size());
}

void with_two_ranks(const std::function<void(Communicator&)>& body) {
  const int port = free_port();
  TrainConfig train;
  train.dist_backend = DistBackend::gloo;
  train.dist_timeout_s = 30;
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        DistEnv env;
        env.rank = env.local_rank = rank;
        env.world_size = 2;
        env.master_port = port;
        auto comm = make_communicator(env, train, torch::Device(torch::kCPU));
        body(*comm);
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

}  // namespace vit::test
