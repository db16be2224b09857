// The run directory's files other than model files and the resume state.
#include "train/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "util/fs.h"
#include "util/log.h"

namespace vit {
namespace fs = std::filesystem;

std::string new_run_name(const std::string& config_name) {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char text[32];
  std::strftime(text, sizeof text, "%Y%m%d-%H%M%S", &local);
  return config_name + "-" + text;
}

void point_latest(const std::string& output_root, const std::string& run_dir) {
  std::error_code error;
  fs::create_directories(output_root, error);
  fs::path target = fs::absolute(run_dir, error);
  const fs::path root = fs::absolute(output_root, error);
  if (target.parent_path() == root) target = target.filename();
  const fs::path link = root / "latest";
  const fs::path temporary = root / (".latest.tmp." + std::to_string(::getpid()));
  fs::remove(temporary, error);
  fs::create_directory_symlink(target, temporary, error);
  if (!error) fs::rename(temporary, link, error);
  if (error) log::warn("could not point " + link.string() + " at " + run_dir + ": " + error.message());
}

RunLock::RunLock(const std::string& dir) {
  const std::string path = dir + "/train.lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error(path + ": cannot open the run's lock file: " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int saved_errno = errno;
    std::string holder;
    char buffer[64] = {};
    const ssize_t count = ::pread(fd_, buffer, sizeof buffer - 1, 0);
    if (count > 0) holder = std::string(buffer, static_cast<size_t>(count));
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    ::close(fd_);
    fd_ = -1;
    if (saved_errno != EWOULDBLOCK) {
      throw std::runtime_error(path + ": cannot lock the run's lock file: " + std::strerror(saved_errno));
    }
    throw std::runtime_error(dir + ": in use by another vit train (pid " + (holder.empty() ? "unknown" : holder) +
                             ", holding " + path + "); wait for it to end or stop it, then resume");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    log::warn(path + ": could not record this process's pid in the lock file: " + std::strerror(errno));
  }
}

RunLock::RunLock(RunLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }

RunLock& RunLock::operator=(RunLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor drops the flock
}

RunDirectory::RunDirectory(std::string path, bool writer, const Config& config,
                           std::optional<uint64_t> resume_metrics_bytes)
    : path_(std::move(path)), writer_(writer) {
  if (!writer_) return;
  make_dirs(path_);
  write_file_atomic(file("config.json"), to_json(config).dump(2) + "\n");
  const std::string metrics_path = file("metrics.jsonl");
  if (resume_metrics_bytes) {
    std::error_code error;
    if (fs::exists(metrics_path, error)) fs::resize_file(metrics_path, *resume_metrics_bytes, error);
  } else {
    write_file_atomic(metrics_path, "");
  }
  point_latest(config.train.output_root, path_);
  log::info("run directory: " + path_);
  metrics_.open(metrics_path, std::ios::app);
}

void RunDirectory::append_metrics(const nlohmann::json& line) {
  if (!writer_) return;
  metrics_ << line.dump() << "\n";
  metrics_.flush();
  if (!metrics_) throw std::runtime_error(file("metrics.jsonl") + ": cannot append a line (disk full?)");
}

uint64_t RunDirectory::metrics_bytes() {
  if (!writer_) return 0;
  if (metrics_.is_open()) metrics_.flush();
  std::error_code error;
  const std::string metrics_path = file("metrics.jsonl");
  return fs::exists(metrics_path, error) ? fs::file_size(metrics_path, error) : 0;
}

void RunDirectory::write_summary(const std::vector<EpochRecord>& history) const {
  if (writer_) write_file_atomic(file("summary.csv"), summary_csv(history));
}

}  // namespace vit
