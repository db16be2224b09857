// Shared test helpers.
#include "test_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "train/distributed.h"

namespace vit::test {

std::string config_path(const std::string& name) {
  std::string path = VIT_TEST_DATA;
  path += "/../../configs/";
  path += name;
  return path;
}

namespace {
std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string make_temp_dir(const std::filesystem::path& parent) {
  std::string pattern = (parent / "vit-test-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error(parent.string() + ": mkdtemp failed");
  return pattern;
}

// A helper's own scratch folder: never handed to Python, always removed.
struct Scratch {
  std::string path = make_temp_dir(std::filesystem::temp_directory_path());
  ~Scratch() {
    std::error_code error;
    std::filesystem::remove_all(path, error);
  }
  std::string file(const std::string& name) const { return path + "/" + name; }
};

// The suite's reference run (tests/reference_run.sh): under ctest every case finds its answers from Python in
// $VIT_REFERENCES (replay); the fixture first runs the Python cases with $VIT_REFERENCE_RECORD set (record), where
// run_python() only writes down what it is asked. Without either (a test binary run by hand), Python runs live.
enum class ReferenceMode { live, record, replay };
struct ReferenceRun {
  ReferenceMode mode = ReferenceMode::live;
  std::string root;    // $VIT_REFERENCES: modules.json, results/
  std::string record;  // $VIT_REFERENCE_RECORD: this round's folder (requests.jsonl, tests.txt, tmp/)
};
const ReferenceRun& reference_run() {
  static const ReferenceRun run = [] {
    ReferenceRun r;
    if (const char* root = std::getenv("VIT_REFERENCES"); root && *root) {
      r.root = root;
      r.mode = ReferenceMode::replay;
      if (const char* record = std::getenv("VIT_REFERENCE_RECORD"); record && *record) {
        r.record = record;
        r.mode = ReferenceMode::record;
      }
    }
    return r;
  }();
  return run;
}

std::string current_test() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return info ? std::string(info->test_suite_name()) + "." + info->name() : "";
}

// The current case's TempDirs in the order it made them, and its run_python() calls so far: a call is named by the
// case, its number and its arguments with each TempDir's path as {tmpN}, the same in the record and replay runs.
struct CaseCalls {
  std::string test;
  std::vector<std::string> dirs;
  int calls = 0;
};
CaseCalls& case_calls() {
  static CaseCalls calls;
  if (calls.test != current_test()) calls = CaseCalls{current_test(), {}, 0};
  return calls;
}
std::mutex case_calls_mutex;  // a case may make TempDirs on several threads
}  // namespace

TempDir::TempDir() {
  const auto& run = reference_run();
  std::filesystem::path parent = std::filesystem::temp_directory_path();
  if (run.mode == ReferenceMode::record) {
    parent = std::filesystem::path(run.record) / "tmp";
    std::filesystem::create_directories(parent);
  }
  path_ = make_temp_dir(parent);
  std::lock_guard<std::mutex> lock(case_calls_mutex);
  case_calls().dirs.push_back(path_);
}

TempDir::~TempDir() {
  if (reference_run().mode == ReferenceMode::record) return;  // the reference run reads it after this case ends
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
  Scratch scratch;
  const std::string out = scratch.file("stdout"), err = scratch.file("stderr");
  const std::string command =
      shell_prefix + "'" + VIT_BINARY + "' " + arguments + " >'" + out + "' 2>'" + err + "'";
  const int raw = std::system(command.c_str());
  CommandResult result;
  result.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  result.output = slurp(out);
  result.errors = slurp(err);
  return result;
}

namespace {
// The Python that answers: the reference Python with timm, transformers, onnx and onnxruntime, or, where it is
// missing, Debian's /usr/bin/python3 for what needs only the standard library or numpy. *missing says why the
// reference Python is not there ("" when it is).
std::string answering_python(std::string* missing) {
  std::string python;
  if (const char* env = std::getenv("VIT_TEST_PYTHON"); env && *env) {
    python = env;
  } else if (const char* venv = std::getenv("VIT_VENV"); venv && *venv) {
    python = std::string(venv) + "/bin/python";
  } else {
    python = VIT_TEST_PYTHON;
  }
  missing->clear();
  if (::access(python.c_str(), X_OK) == 0) return python;
  *missing = "reference libraries not installed: no " + python + " (scripts/setup.sh makes it with VIT_SETUP_TEST_EXTRAS=1)";
  return "/usr/bin/python3";
}

std::string last_line(std::string text) {
  const auto last = text.find_last_not_of('\n');
  text = text.substr(0, last == std::string::npos ? 0 : last + 1);
  const auto line = text.rfind('\n');
  return line == std::string::npos ? text : text.substr(line + 1);
}

nlohmann::json read_json_file(const std::string& path) {
  const std::string text = slurp(path);
  if (text.empty()) throw std::runtime_error(path + ": missing or empty");
  return nlohmann::json::parse(text);
}

// FNV-1a over a file's bytes, or over a folder's sorted names and files, with each of the case's TempDir paths read
// as {tmpN} (a gallery page names its images by path); "" when nothing is there.
std::string content_hash(const std::filesystem::path& path, const std::vector<std::string>& dirs) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::exists(path, error)) return "";
  uint64_t h = 1469598103934665603ull;
  auto add = [&h, &dirs](std::string bytes) {
    for (size_t i = 0; i < dirs.size(); ++i) {
      const std::string key = "{tmp" + std::to_string(i) + "}";
      for (size_t at = bytes.find(dirs[i]); at != std::string::npos; at = bytes.find(dirs[i], at + key.size())) {
        bytes.replace(at, dirs[i].size(), key);
      }
    }
    for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  };
  if (fs::is_directory(path)) {
    std::vector<std::string> names;
    for (const auto& entry : fs::recursive_directory_iterator(path)) {
      if (entry.is_regular_file()) names.push_back(fs::relative(entry.path(), path).string());
    }
    std::sort(names.begin(), names.end());
    for (const auto& name : names) add(name + "\n" + slurp((path / name).string()) + "\n");
  } else {
    add(slurp(path.string()));
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

std::string hash_id(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

// One run_python() call as the reference run names it: {tmpN} for the case's N-th TempDir, the paths of the files
// it already holds that the arguments name (with their hashes: the replay checks it hands Python's answer to the
// same inputs), and an id.
struct Call {
  std::string test, args;  // args with {tmpN}
  int number = 0;
  std::string id;
  nlohmann::json dirs = nlohmann::json::object();    // "tmpN" -> this run's path
  nlohmann::json inputs = nlohmann::json::object();  // "tmpN/relative" -> content hash
};

std::filesystem::path local_path(const Call& call, const std::string& name) {
  const auto slash = name.find('/');
  return std::filesystem::path(call.dirs.at(name.substr(0, slash)).get<std::string>()) / name.substr(slash + 1);
}

Call describe_call(const std::string& script, const std::string& arguments) {
  std::lock_guard<std::mutex> lock(case_calls_mutex);
  auto& calls = case_calls();
  Call call;
  call.test = calls.test;
  call.number = ++calls.calls;
  call.args = arguments;
  for (size_t i = 0; i < calls.dirs.size(); ++i) {
    const std::string key = "tmp" + std::to_string(i), path = calls.dirs[i];
    bool used = false;
    for (size_t at = call.args.find(path); at != std::string::npos; at = call.args.find(path, at)) {
      call.args.replace(at, path.size(), "{" + key + "}");
      used = true;
    }
    if (used) call.dirs[key] = path;
  }
  // Each {tmpN}/relative/path in the arguments, up to a quote, space, comma or colon.
  for (size_t at = call.args.find("{tmp"); at != std::string::npos; at = call.args.find("{tmp", at + 1)) {
    const auto close = call.args.find('}', at);
    const auto end = call.args.find_first_of("'\" ,:", close);
    const std::string name = call.args.substr(at + 1, close - at - 1) + call.args.substr(close + 1, end - close - 1);
    if (name.find('/') == std::string::npos) continue;
    const std::string hash = content_hash(local_path(call, name), calls.dirs);
    if (!hash.empty()) call.inputs[name] = hash;
  }
  call.id = hash_id(call.test + "\n" + std::to_string(call.number) + "\n" + script + "\n" + call.args);
  return call;
}

void append_line(const std::string& path, const std::string& line) {
  std::ofstream out(path, std::ios::app);
  out << line << "\n";
  if (!out) throw std::runtime_error(path + ": cannot append");
}

std::string result_path(const Call& call) { return reference_run().root + "/results/" + call.id + ".json"; }

// Replay: the answer the reference run gave to this call, its files copied into this run's TempDirs.
std::string replay(const std::string& script, const std::string& arguments, const Call& call) {
  const auto& run = reference_run();
  const std::string path = result_path(call);
  const std::string what = call.test + " call #" + std::to_string(call.number) + " (" + script + " " + call.args + ")";
  if (::access(path.c_str(), R_OK) != 0) {
    throw std::runtime_error("no reference answer for " + what + ": the reference run (ctest's `references`, " +
                             run.root + "/log.txt) did not make it; a case that calls Python must match the reference "
                             "filter in tests/CMakeLists.txt" +
                             (call.number > 1 ? ", and one whose later call reads what vit made from an earlier "
                                                "answer must be listed in VIT_REFERENCE_LATER_ROUNDS there"
                                              : ""));
  }
  const auto result = read_json_file(path);
  std::vector<std::string> dirs;
  {
    std::lock_guard<std::mutex> lock(case_calls_mutex);
    dirs = case_calls().dirs;
  }
  for (const auto& [name, hash] : result["inputs"].items()) {
    if (content_hash(local_path(call, name), dirs) != hash.get<std::string>()) {
      throw std::runtime_error(what + ": " + name + " differs from the file the reference run answered for (" +
                               local_path(call, name).string() + "): the case must write the same inputs each run");
    }
  }
  if (result["status"].get<int>() != 0) {
    throw std::runtime_error(script + " " + arguments + " failed:\n" + result["stdout"].get<std::string>() +
                             result["stderr"].get<std::string>());
  }
  namespace fs = std::filesystem;
  for (const auto& output : result["outputs"]) {
    const std::string name = output.get<std::string>();
    const auto slash = name.find('/');
    const fs::path from = fs::path(result["dirs"].at(name.substr(0, slash)).get<std::string>()) / name.substr(slash + 1);
    const fs::path to = local_path(call, name);
    fs::create_directories(to.parent_path());
    fs::copy_file(from, to, fs::copy_options::overwrite_existing);
  }
  return result["stdout"].get<std::string>();
}
}  // namespace

std::string reference_python(const std::vector<std::string>& modules, std::string* why) {
  std::string scratch_why;
  if (!why) why = &scratch_why;
  const auto& run = reference_run();
  if (run.mode == ReferenceMode::record) return "(recorded)";  // the replay decides, from modules.json
  if (run.mode == ReferenceMode::replay) {
    const auto probe = read_json_file(run.root + "/modules.json");
    const std::string missing = probe["reference_missing"].get<std::string>();
    for (const auto& m : modules) {
      if (!probe["modules"].contains(m)) {
        *why = missing.empty() ? "module " + m + " is not in the reference run's probe (tests/reference_batch.py MODULES)"
                               : missing;
        return "";
      }
      const std::string error = probe["modules"][m].get<std::string>();
      if (!error.empty()) {
        *why = missing.empty() ? "reference libraries not installed in " + probe["python"].get<std::string>() + ": " + error
                               : missing;
        return "";
      }
    }
    return probe["python"].get<std::string>();
  }
  std::string missing;
  const std::string python = answering_python(&missing);
  if (::access(python.c_str(), X_OK) != 0) {
    *why = missing.empty() ? "no " + python : missing;
    return "";
  }
  std::string imports;
  for (const auto& m : modules) imports += "import " + m + "; ";
  Scratch scratch;
  const std::string command =
      test::quoted(python) + " -c " + test::quoted(imports) + " >/dev/null 2>" + test::quoted(scratch.file("err"));
  if (std::system(command.c_str()) != 0) {
    *why = missing.empty() ? "reference libraries not installed in " + python + ": " + last_line(slurp(scratch.file("err")))
                           : missing;
    return "";
  }
  return python;
}

std::string run_python(const std::string& script, const std::string& arguments) {
  const auto& run = reference_run();
  if (run.mode != ReferenceMode::live) {
    const Call call = describe_call(script, arguments);
    // A call an earlier round answered is replayed, so that the case gets as far as its next question.
    if (run.mode == ReferenceMode::replay || ::access(result_path(call).c_str(), R_OK) == 0) {
      return replay(script, arguments, call);
    }
    append_line(run.record + "/requests.jsonl", nlohmann::json{{"id", call.id},
                                                               {"test", call.test},
                                                               {"call", call.number},
                                                               {"script", script},
                                                               {"args", arguments},
                                                               {"dirs", call.dirs},
                                                               {"inputs", call.inputs}}
                                                    .dump());
    append_line(run.record + "/tests.txt", call.test);
    return "";  // recorded: the case goes on as far as it can without the answer
  }
  std::string missing;
  const std::string python = answering_python(&missing);
  Scratch scratch;
  const std::string out = scratch.file("stdout"), err = scratch.file("stderr");
  const std::string command = test::quoted(python) + " " + test::quoted(std::string(VIT_TEST_SOURCE) + "/" + script) + " " +
                              arguments + " >" + test::quoted(out) + " 2>" + test::quoted(err);
  const int raw = std::system(command.c_str());
  if (!WIFEXITED(raw) || WEXITSTATUS(raw) != 0) {
    throw std::runtime_error(script + " " + arguments + " failed:\n" + slurp(out) + slurp(err));
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

void perturb_weights(VisionTransformer& net, uint64_t seed) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(seed);
  for (auto& p : net->parameters()) {
    const double fan_in = p.dim() >= 2 ? static_cast<double>(p.numel() / p.size(0)) : 1.0;
    p.add_(torch::randn_like(p) * (0.2 / std::sqrt(fan_in)));
  }
}

VisionTransformer perturbed_model(const ModelConfig& config, uint64_t seed) {
  torch::manual_seed(0);
  VisionTransformer net(config);
  perturb_weights(net, seed);
  net->eval();
  return net;
}

}  // namespace vit::test
