// Shared test helpers.
#include "test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

namespace vit::test {

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

CommandResult run_vit(const std::string& arguments) {
  TempDir scratch;
  const std::string out = scratch.file("stdout"), err = scratch.file("stderr");
  const std::string command = std::string("'") + VIT_BINARY + "' " + arguments + " >'" + out + "' 2>'" + err + "'";
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

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  const bool found = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
                     ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  if (fd >= 0) ::close(fd);
  if (!found) throw std::runtime_error("cannot find a free port on 127.0.0.1");
  return ntohs(address.sin_port);
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

}  // namespace vit::test
