// The input-pipeline benchmark: the Loader as training drives it, without the model.
#include "bench/data_bench.h"

#include <chrono>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "data/dataset.h"
#include "data/loader.h"

namespace vit {

std::vector<DataBenchRow> run_data_bench(const Config& config, std::shared_ptr<const ImageCodec> codec,
                                         const DataBenchOptions& options, RawAugment raw_augment) {
  if (options.batch_size <= 0 || options.warmup_batches < 1) {
    throw std::invalid_argument("data bench: batch size " + std::to_string(options.batch_size) + " and warm-up " +
                                std::to_string(options.warmup_batches) + " batches must be positive (the clock " +
                                "starts at the end of the warm-up)");
  }
  // Only the training split is read: a folder without validation data benches as well.
  const Splits splits = open_datasets(config.data, config.train.seed, codec, SplitsWanted::train_only);
  const SampleTransform transform = make_train_transform(config.data, config.model, std::move(raw_augment));
  const BatchTransform mix =
      make_mix_transform(config.data.augment, config.model.num_classes, config.train.label_smoothing);
  std::vector<DataBenchRow> rows;
  for (const int64_t workers : options.workers) {
    LoaderOptions loader_options;
    loader_options.batch_size = options.batch_size;
    loader_options.seed = config.train.seed;
    loader_options.num_workers = workers;
    loader_options.prefetch = config.data.prefetch_batches;
    Loader loader(splits.train, transform, loader_options, mix);
    if (loader.batches_per_epoch() <= options.warmup_batches) {
      throw std::invalid_argument("data bench: " + std::to_string(loader.batches_per_epoch()) + " batches of " +
                                  std::to_string(options.batch_size) + " in the training split, not more than the " +
                                  std::to_string(options.warmup_batches) + " warm-up batches");
    }
    loader.start_epoch(0);
    DataBenchRow row;
    row.workers = workers;
    std::chrono::steady_clock::time_point start;
    int64_t batches = 0;
    while (auto batch = loader.next()) {
      if (++batches <= options.warmup_batches) {
        if (batches == options.warmup_batches) start = std::chrono::steady_clock::now();
        continue;
      }
      row.images += batch->images.size(0);
      if (options.max_batches > 0 && batches - options.warmup_batches >= options.max_batches) break;
    }
    row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    row.img_per_s = row.seconds > 0 ? static_cast<double>(row.images) / row.seconds : 0.0;
    rows.push_back(row);
  }
  return rows;
}

nlohmann::json to_json(const DataBenchRow& row) {
  return {{"workers", row.workers}, {"images", row.images}, {"seconds", row.seconds}, {"img_per_s", row.img_per_s}};
}

}  // namespace vit
