// The run directory's files other than model files and the resume state.
#include "train/run_dir.h"

#include <unistd.h>

#include <ctime>
#include <filesystem>

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
