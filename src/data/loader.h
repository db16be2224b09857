// Batches from a Dataset on background threads, in an order that depends only on (seed, epoch) and is sharded
// across ranks, so results never depend on the number of workers, on timing, or on where an epoch was resumed.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <torch/types.h>

#include "data/dataset.h"

namespace vit {

struct Batch {
  torch::Tensor images;          // (B, C, H, W) float32
  torch::Tensor labels;          // (B) int64
  torch::Tensor soft_targets;    // (B, K) float32 when a mixup/cutmix transform ran (rows sum to 1), else undefined
  std::vector<int64_t> indices;  // dataset indices of the rows
};

// One sample to a (C, H, W) float32 tensor; the RNG is seeded per sample from (seed, epoch, order position).
// The input is decoded pixels, or an encoded file (datasets of files), which the transform decodes.
using SampleTransform = std::function<torch::Tensor(ImageInput input, std::mt19937_64& rng)>;
// In-place work on a whole batch (e.g. mixup); the RNG is seeded from (seed, epoch, global batch, rank).
using BatchTransform = std::function<void(Batch& batch, std::mt19937_64& rng)>;

struct LoaderOptions {
  int64_t batch_size = 32;           // B: rows per batch on this rank
  bool shuffle = true;               // seed-determined order per epoch (false: dataset order)
  bool drop_last = true;             // drop the incomplete global tail (training); false: every sample once
  uint64_t seed = 0;                 // drives the order and every transform RNG
  int64_t num_workers = 2;           // decode/augment threads; 0 = decode in the calling thread
  int64_t prefetch = 4;              // batches in flight (claimed or ready, not yet returned)
  int64_t rank = 0, world_size = 1;  // shard ONE global seed-determined order across ranks
  bool skip_bad_images = false;      // true: drop failing samples from the batch, record them; false: rethrow
  bool pin_memory = false;           // pin batches (only when CUDA is available)
};

// Sharding rule. The epoch's order is one permutation of all N samples (Fisher-Yates from mix_seed(seed, epoch)).
// Global batch g covers order positions [g*B*W, (g+1)*B*W); rank r takes the r-th slice of B, so W ranks with batch B
// see exactly the rows one rank with batch W*B sees, in the same order when concatenated by rank.
// drop_last drops the incomplete global tail T = N mod (B*W). Without drop_last the tail is split into W contiguous
// chunks, the first T mod W ranks getting one sample more (floor(T/W) or floor(T/W) + 1 rows, rank order); a rank
// whose chunk is empty has one batch fewer. Every sample is seen exactly once across ranks, with no padding.
// (batch_positions in dataset.h computes this rule.)
// A StreamDataset (tar shards) supplies the epoch's order itself, in the same layout, and its samples come through
// the stream it opens for this rank (from first_batch on) instead of by index; the transforms' RNGs are as above.
class Loader {
 public:
  Loader(std::shared_ptr<const Dataset> dataset, SampleTransform transform, LoaderOptions options,
         BatchTransform batch_transform = {});
  ~Loader();  // stops and joins the workers, also mid-epoch
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  int64_t batches_per_epoch() const;  // on this rank
  // Starts (or restarts) an epoch; first_batch > 0 resumes mid-epoch with exactly the batches a full epoch would
  // have produced from there on.
  void start_epoch(int64_t epoch, int64_t first_batch = 0);
  // The next batch in order; std::nullopt at the end of the epoch. Rethrows worker errors on the caller's thread.
  std::optional<Batch> next();
  std::vector<std::string> bad_images() const;  // sources skipped so far ("<source>: <reason>" is logged)

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace vit
