// Shared test helpers: reference data paths, temporary directories, running the `vit` binary, the small models and
// datasets that many tests build, and the skips for what a build or machine lacks.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/cuda.h>
#include <torch/torch.h>
#include <torch/version.h>

#include "config/config.h"
#include "data/image.h"
#include "launch/launch.h"
#include "model/vit.h"
#include "vit/build_config.h"

// CUDA cases skip with a visible reason where this libtorch has no CUDA or no GPU is visible (Debian's CPU libtorch).
#define SKIP_WITHOUT_CUDA()                                                                                     \
  if (!torch::cuda::is_available()) {                                                                           \
    GTEST_SKIP() << "CUDA test skipped: this libtorch (" TORCH_VERSION ") has no CUDA support or no GPU is visible"; \
  }

// Multi-process and collective tests need c10d; a build configured without it says so instead of failing.
#define SKIP_WITHOUT_C10D() \
  if (!VIT_WITH_DISTRIBUTED) GTEST_SKIP() << "built with VIT_WITH_DISTRIBUTED=OFF: no c10d to test"

// Tests that compare with the real reference libraries skip with a visible reason where they are not installed
// (PyPI unreachable during set-up); scripts/setup.sh installs them for scripts/test.sh.
#define SKIP_WITHOUT_PYTHON(...)                                                         \
  {                                                                                      \
    std::string why_;                                                                    \
    if (::vit::test::reference_python({__VA_ARGS__}, &why_).empty()) GTEST_SKIP() << why_; \
  }

namespace vit {
class Communicator;
}

namespace vit::test {

// Appended: GCC 12 in C++20 mode warns falsely (-Warray-bounds) on std::string + "/" + name here.
inline std::string data_path(const std::string& name) {
  std::string path = VIT_TEST_DATA;
  path += '/';
  path += name;
  return path;
}

// The repository's configs/`name` (configs/fashion_mnist.json, ...): tests take shipped configs from there.
std::string config_path(const std::string& name);

// A fresh empty directory under the system temp dir, removed when the object dies (kept, in the reference run's
// folder, while the reference run records what the case asks of Python).
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  std::string operator/(const std::string& name) const { return file(name); }

 private:
  std::string path_;
};

// Writes `bytes` to `path`, creating parent folders; throws naming the path when that fails.
void write_bytes(const std::string& path, const std::string& bytes);

// The message of the std::exception `action` throws, or "(no error)" when it throws none.
template <typename Action>
std::string error_of(Action&& action) {
  try {
    action();
  } catch (const std::exception& error) {
    return error.what();
  }
  return "(no error)";
}

// `text` in single quotes, for a /bin/sh command line.
std::string quoted(const std::string& text);

struct CommandResult {
  int status = -1;     // exit status (or -1 when killed by a signal)
  std::string output;  // stdout
  std::string errors;  // stderr
};
// Runs `vit <arguments>` (arguments are passed to /bin/sh, quote as needed), after `shell_prefix` (e.g. "ulimit -f
// 64; ") in the same shell.
CommandResult run_vit(const std::string& arguments, const std::string& shell_prefix = "");
// Runs `vit ARGUMENTS`, sends it `signal` as soon as `wait_for` exists (a run's first resume state), and returns
// its wait status.
int run_vit_and_kill(const std::string& arguments, const std::string& wait_for, int signal);

// The Python that answers `modules` (the project's virtual environment .venv/ or $VIT_VENV, made by
// scripts/setup.sh with VIT_SETUP_TEST_EXTRAS=1 with timm, transformers, onnx and onnxruntime from PyPI, or
// $VIT_TEST_PYTHON; where it is missing, Debian's /usr/bin/python3 for the standard library and numpy). Empty, with
// the reason in *why (when given), where it cannot import one of `modules`. Under ctest the suite's one reference run
// has probed them (tests/reference_run.sh): no interpreter starts here.
std::string reference_python(const std::vector<std::string>& modules, std::string* why);

// Runs tests/`script` with `arguments` (passed to /bin/sh, quote as needed) in that Python; throws with its stderr
// when it fails. Returns its stdout. Under ctest the answer comes from the suite's one reference run, which ran the
// same call (the case's TempDirs standing for themselves) and whose files in them are copied into this run's; a
// file the arguments name must hold the same bytes as when the reference run answered.
std::string run_python(const std::string& script, const std::string& arguments);

// The model and preprocessing of tests/data/tiny32/weights.safetensors (a timm file without metadata) as a config
// file in `dir`, for --config; returns its path.
std::string write_tiny32_config(const TempDir& dir);

// A ViT small enough for a unit test: `img` x `img` inputs (set img_w for a rectangle) in `patch` px patches,
// `depth` blocks of `num_heads` heads over `embed_dim` channels; every other field is ModelConfig's default.
ModelConfig tiny_vit(int64_t img, int64_t patch, int64_t in_chans, int64_t num_classes, int64_t embed_dim,
                     int64_t depth, int64_t num_heads, double mlp_ratio);

// A ModelConfig that sets only the input geometry, H x W with C channels: all the data transforms read from it.
ModelConfig input_model(int64_t H, int64_t W, int64_t C);

// A DataConfig that reads dataset `format` from `root`, every other field at its default.
DataConfig dataset_config(const std::string& format, const std::string& root);

// An H x W x C image with pixel (y, x, c) = (9y + 5x + 60c) mod 256: smooth, and different in every channel.
RawImage gradient_image(int64_t H, int64_t W, int64_t C);

// A learnable MNIST-format dataset of 16x16 images in `dir` (train-*/t10k-* IDX files, raw): class k of 4 has a
// bright 4x4 square in quadrant k and background level 20 + 30k, plus noise (the brightness makes it learnable in a
// few steps; the square needs position embeddings).
void write_idx_dataset(const std::string& dir, int train_count, int test_count);

// A TCP port that nothing listens on right now (for a rendezvous store): the one `vit launch` uses.
using vit::free_port;

// Runs `body(comm)` for ranks 0 and 1 of a fresh gloo group on loopback, each on its own thread; expects neither
// to throw.
void with_two_ranks(const std::function<void(Communicator&)>& body);
// The plain reference the trainer's overlapped GradientReducer is held to: averages `flat` over the ranks in
// all-reduces of about `bucket_bytes` each, all in flight at once.
void all_reduce_mean(Communicator& comm, torch::Tensor& flat, int64_t bucket_bytes = 25 << 20);

// max |a - b| over all elements.
double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b);
// Moves every parameter off timm's init (zero biases, unit norms, equal LayerScale) so that each one shapes the
// output: matrices by 0.2 / sqrt(fan-in), which keeps activations at their scale at any width.
void perturb_weights(VisionTransformer& net, uint64_t seed);
// A model of `config` (seeded init), perturbed with `seed`, in eval mode.
VisionTransformer perturbed_model(const ModelConfig& config, uint64_t seed);

}  // namespace vit::test
