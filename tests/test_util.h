// Shared test helpers: reference data paths, temporary directories, running the `vit` binary.
#pragma once

#include <stdexcept>
#include <string>

#include <torch/torch.h>

namespace vit::test {

// Appended: GCC 12 in C++20 mode warns falsely (-Warray-bounds) on std::string + "/" + name here.
inline std::string data_path(const std::string& name) {
  std::string path = VIT_TEST_DATA;
  path += '/';
  path += name;
  return path;
}

// A fresh empty directory under the system temp dir, removed when the object dies.
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

struct CommandResult {
  int status = -1;     // exit status (or -1 when killed by a signal)
  std::string output;  // stdout
  std::string errors;  // stderr
};
// Runs `vit <arguments>` (arguments are passed to /bin/sh, quote as needed).
CommandResult run_vit(const std::string& arguments);

// A learnable MNIST-format dataset of 16x16 images in `dir` (train-*/t10k-* IDX files, raw): class k of 4 has a
// bright 4x4 square in quadrant k and background level 20 + 30k, plus noise (the brightness makes it learnable in a
// few steps; the square needs position embeddings).
void write_idx_dataset(const std::string& dir, int train_count, int test_count);

// A TCP port on 127.0.0.1 that nothing listens on right now (for a rendezvous store).
int free_port();

// max |a - b| over all elements.
double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b);

}  // namespace vit::test
