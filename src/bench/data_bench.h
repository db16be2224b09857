// `vit bench --mode data`: images/s of a config's training input pipeline (read + decode + augment + collate) on its
// training split, folder, CSV or shards, for several loader worker counts.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "config/config.h"
#include "data/augment.h"
#include "data/image.h"

namespace vit {

struct DataBenchOptions {
  std::vector<int64_t> workers = {1, 2};  // loader threads to measure, one measurement each (0 = the calling thread)
  int64_t batch_size = 64;                // rows per batch
  int64_t warmup_batches = 5;             // untimed batches at the start of each measurement (>= 1)
  int64_t max_batches = 0;                // > 0: stop each measurement after this many timed batches (0 = one epoch)
};

struct DataBenchRow {
  int64_t workers = 0;
  int64_t images = 0;      // timed images
  double seconds = 0.0;    // from the end of the warm-up to the last timed batch
  double img_per_s = 0.0;
};

// Opens the config's training split with `codec` and times its training transform (make_train_transform with
// `raw_augment`, the config's batch transform too) through the Loader, shuffled as in training, for each worker count.
std::vector<DataBenchRow> run_data_bench(const Config& config, std::shared_ptr<const ImageCodec> codec,
                                         const DataBenchOptions& options, RawAugment raw_augment = {});

nlohmann::json to_json(const DataBenchRow& row);

}  // namespace vit
