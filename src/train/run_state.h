// state.safetensors: everything that decides a run's next update (weights, AdamW moments, EMA, every rank's RNG)
// as tensors, and the run's progress as JSON metadata, so that --resume continues bit-exactly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "io/safetensors.h"
#include "train/history.h"

namespace vit {

// The run's progress that is not in the tensors.
struct RunState {
  int64_t epoch = 0;          // current epoch, 0-based
  int64_t step_in_epoch = 0;  // optimiser steps done in the current epoch
  int64_t global_step = 0;    // optimiser steps done in all
  double epoch_loss_sum = 0.0;
  int64_t epoch_loss_count = 0;
  double epoch_seconds = 0.0;
  int64_t epoch_images = 0;
  double best_top1 = -1.0;
  double elapsed_seconds = 0.0;     // wall time of the run before this process
  double seconds_to_target = -1.0;  // wall time when eval top-1 first reached train.target_top1 (-1 = not yet)
  uint64_t metrics_bytes = 0;       // metrics.jsonl is cut back to this length on resume
  double loss_scale = 65536.0;      // fp16 dynamic loss scale (LossScaler)
  int64_t good_steps = 0;           // fp16 steps since the scale last changed
  std::vector<EpochRecord> history;
};

nlohmann::json to_json(const RunState& state);
// Throws naming `source` when a key is missing or has the wrong type. Reads files of every version so far
// ("seconds_to_90" is the older name of "seconds_to_target").
RunState run_state_from_json(const nlohmann::json& object, const std::string& source);

inline constexpr const char* kRunStateFormat = "vit-train-state";
inline constexpr int kRunStateFormatVersion = 1;

// Writes the state file atomically: `tensors` plus the progress and the world size as metadata.
void write_run_state(const std::string& path, const safetensors::NamedTensors& tensors, const RunState& state,
                     int world_size);

// A state file read back and checked (format name and version, progress metadata).
struct SavedRun {
  safetensors::Archive archive;
  RunState state;
  int world_size = 1;  // ranks that saved it (each rank's data position and RNG stream are in it)
  // The tensor by name, in its saved dtype; throws "<path>: missing tensor <name>".
  torch::Tensor tensor(const std::string& name) const;
};
SavedRun read_run_state(const std::string& path);

}  // namespace vit
