// A training run's directory: config.json, metrics.jsonl, summary.csv, and the <output_root>/latest link. Only the
// main rank writes; on the other ranks every call is a no-op.
#pragma once

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "config/config.h"
#include "train/history.h"

namespace vit {

// "<config_name>-<local time as YYYYmmdd-HHMMSS>": the name of a new run directory.
std::string new_run_name(const std::string& config_name);

// <output_root>/latest -> run_dir, replaced atomically (relative when the run sits directly in output_root, so the
// runs folder can move); a failure is a warning, never an error.
void point_latest(const std::string& output_root, const std::string& run_dir);

// The run directory's lock file, <dir>/train.lock, held by the process that trains into it: a second `vit train`
// (a --resume of the same run, an --out naming it) refuses at once, naming the holder's pid. The lock is a flock on
// the open file: the kernel drops it when the holder exits in any way, SIGKILL included, so a crashed run never leaves
// it stuck; the file itself stays, holding the last holder's pid.
class RunLock {
 public:
  RunLock() = default;  // holds nothing (ranks other than the main one)
  // Takes the lock of an existing directory or throws "<dir>: in use by another vit train (pid N)...".
  explicit RunLock(const std::string& dir);
  RunLock(RunLock&& other) noexcept;
  RunLock& operator=(RunLock&& other) noexcept;
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;
  ~RunLock();

 private:
  int fd_ = -1;
};

class RunDirectory {
 public:
  // Creates the directory, writes config.json (what --resume reads back), starts metrics.jsonl empty, or for a
  // resumed run cuts it back to `resume_metrics_bytes` (the lines written after the saved state are dropped, as they
  // will be written again), and points <output_root>/latest here.
  RunDirectory(std::string path, bool writer, const Config& config, std::optional<uint64_t> resume_metrics_bytes);

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  bool writer() const { return writer_; }

  // Appends one JSON line to metrics.jsonl and flushes it; throws naming the file when the write fails (a full disk).
  void append_metrics(const nlohmann::json& line);
  // metrics.jsonl's length after a flush (saved in the resume state).
  uint64_t metrics_bytes();
  // summary.csv from the history, written atomically.
  void write_summary(const std::vector<EpochRecord>& history) const;

 private:
  std::string path_;
  bool writer_;
  std::ofstream metrics_;
};

}  // namespace vit
