// Loader: workers claim batch numbers in order, build them independently (every RNG is seeded from the batch's
// own coordinates), and park them in a reorder buffer that next() drains in order.
#include "data/loader.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <stdexcept>
#include <thread>

#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "util/log.h"
#include "util/runtime.h"

namespace vit {
namespace {

constexpr uint64_t kSampleSalt = 0x73616d706c65ull;  // "sample"
constexpr uint64_t kBatchSalt = 0x6261746368ull;     // "batch"

struct Slot {
  Batch batch;
  std::exception_ptr error;
};

// "<source>: <message>", unless the message already starts with the source.
std::string with_source(const std::string& source, const std::string& message) {
  return message.rfind(source, 0) == 0 ? message : source + ": " + message;
}

}  // namespace

struct Loader::State {
  std::shared_ptr<const Dataset> dataset;
  SampleTransform transform;
  BatchTransform batch_transform;
  LoaderOptions options;
  bool pin = false;
  std::vector<std::thread> workers;

  // Guarded by `mutex`:
  std::mutex mutex;
  std::condition_variable work_ready;   // workers wait for a batch to claim (or stop)
  std::condition_variable batch_ready;  // next() waits for the batch it needs
  bool stop = false;
  bool started = false;
  uint64_t generation = 0;  // bumped by start_epoch: results of an abandoned epoch are dropped
  int64_t epoch = 0;
  std::shared_ptr<const std::vector<int64_t>> order;  // this epoch's permutation of all samples (global)
  std::shared_ptr<SampleStream> stream;  // this epoch's reader, for a StreamDataset
  int64_t next_claim = 0;   // next batch a worker may build
  int64_t next_return = 0;  // next batch next() hands out
  int64_t end = 0;          // batches this epoch on this rank
  std::map<int64_t, Slot> ready;  // reorder buffer

  // Batch image tensors handed out before, reused once nobody else holds them (guarded by `pool_mutex`): a fresh
  // (B, C, H, W) float tensor of tens of MB is a new mapping whose pages the kernel zeroes on first touch, which cost
  // a sixth of the input pipeline's time at 224x224.
  std::mutex pool_mutex;
  std::vector<torch::Tensor> pool;

  // Guarded by `bad_mutex` (workers record while the caller reads):
  mutable std::mutex bad_mutex;
  std::vector<std::string> bad;
  std::set<std::string> bad_seen;

  // Order positions [first, first + count) of batch k on this rank.
  std::pair<int64_t, int64_t> positions(int64_t k) const {
    return batch_positions(dataset->size(), options.batch_size, options.world_size, options.rank, k);
  }

  int64_t batches() const {
    const int64_t B = options.batch_size, W = options.world_size;
    const int64_t full = dataset->size() / (B * W);
    if (options.drop_last) return full;
    return full + (positions(full).second > 0 ? 1 : 0);
  }

  torch::Tensor batch_tensor(const std::vector<int64_t>& shape) {
    std::lock_guard<std::mutex> lock(pool_mutex);
    for (const torch::Tensor& kept : pool) {
      // Only the pool's handle left (views of a handed-out batch share its storage and count there).
      if (kept.use_count() == 1 && kept.storage().use_count() == 1 && kept.sizes() == shape) return kept;
    }
    torch::Tensor fresh = torch::empty(shape, torch::kFloat32);
    if (static_cast<int64_t>(pool.size()) < options.prefetch + options.num_workers + 2) {
      pool.push_back(fresh);
    } else {
      pool[0] = fresh;  // shapes changed (or batches are being kept): keep the newest
    }
    return fresh;
  }

  void record_bad(const std::string& source, const std::string& reason) {
    std::lock_guard<std::mutex> lock(bad_mutex);
    if (!bad_seen.insert(source).second) return;
    bad.push_back(source);
    log::warn(with_source(source, reason) + " (skipped)");
  }

  Batch build(int64_t k, int64_t epoch_number, const std::vector<int64_t>& epoch_order, SampleStream* stream) {
    torch::NoGradGuard no_grad;
    const auto [first, count] = positions(k);
    Batch batch;
    std::vector<int64_t> labels;
    labels.reserve(count);
    batch.indices.reserve(count);
    int64_t sample_numel = 0;
    for (int64_t p = first; p < first + count; ++p) {
      const int64_t index = epoch_order[p];
      torch::Tensor x;  // (C, H, W)
      int64_t label = -1;
      // A stream that cannot be read (a truncated shard) stops the epoch, whatever on_bad_image says.
      InputSample sample;
      if (stream) sample = stream->take(index);
      try {
        if (!stream) sample = dataset->get_input(index);
        label = sample.label;
        std::mt19937_64 rng(mix_seed({options.seed, static_cast<uint64_t>(epoch_number), static_cast<uint64_t>(p),
                                      kSampleSalt}));
        x = transform(std::move(sample.input), rng);
        if (!x.defined() || x.dim() != 3 || x.scalar_type() != torch::kFloat32) {
          throw std::runtime_error("the sample transform must return a float32 (C, H, W) tensor, got " +
                                   (x.defined() ? std::string(x.toString()) + " " + c10::str(x.sizes())
                                                : std::string("an undefined tensor")));
        }
        if (batch.images.defined() && x.sizes() != batch.images.sizes().slice(1)) {
          throw std::runtime_error("transformed to " + c10::str(x.sizes()) + " but earlier rows of the batch are " +
                                   c10::str(batch.images.sizes().slice(1)));
        }
      } catch (const std::exception& error) {
        const std::string source = dataset->source(index);
        if (options.skip_bad_images) {
          record_bad(source, error.what());
          continue;
        }
        throw std::runtime_error(with_source(source, error.what()));
      }
      if (!batch.images.defined()) {
        std::vector<int64_t> shape = {count};
        for (int64_t size : x.sizes()) shape.push_back(size);
        batch.images = batch_tensor(shape);  // (B, C, H, W)
        sample_numel = x.numel();
      }
      // Collate in place: each sample is copied once, straight into its row.
      const torch::Tensor contiguous = x.contiguous();
      const int64_t row = static_cast<int64_t>(batch.indices.size());
      std::memcpy(batch.images.data_ptr<float>() + row * sample_numel, contiguous.data_ptr<float>(),
                  sample_numel * sizeof(float));
      batch.indices.push_back(index);
      labels.push_back(label);
    }
    const int64_t rows = static_cast<int64_t>(batch.indices.size());
    if (rows == 0) return batch;  // every sample was bad: next() moves on
    if (rows < count) batch.images = batch.images.narrow(0, 0, rows);
    batch.labels = torch::tensor(labels, torch::kInt64);  // (B)
    if (batch_transform) {
      std::mt19937_64 rng(mix_seed({options.seed, static_cast<uint64_t>(epoch_number), static_cast<uint64_t>(k),
                                    static_cast<uint64_t>(options.rank), kBatchSalt}));
      batch_transform(batch, rng);
    }
    if (pin) {
      batch.images = batch.images.pin_memory();
      batch.labels = batch.labels.pin_memory();
      if (batch.soft_targets.defined()) batch.soft_targets = batch.soft_targets.pin_memory();
    }
    return batch;
  }

  void work() {
    use_one_intra_op_thread();
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      work_ready.wait(lock, [&] {
        return stop || (started && next_claim < end && next_claim < next_return + options.prefetch);
      });
      if (stop) return;
      const int64_t k = next_claim++;
      const uint64_t claimed_generation = generation;
      const int64_t claimed_epoch = epoch;
      const std::shared_ptr<const std::vector<int64_t>> claimed_order = order;
      const std::shared_ptr<SampleStream> claimed_stream = stream;
      lock.unlock();
      Slot slot;
      try {
        slot.batch = build(k, claimed_epoch, *claimed_order, claimed_stream.get());
      } catch (...) {
        slot.error = std::current_exception();
      }
      lock.lock();
      if (claimed_generation == generation) {
        ready.emplace(k, std::move(slot));
        batch_ready.notify_all();
      }
    }
  }
};

Loader::Loader(std::shared_ptr<const Dataset> dataset, SampleTransform transform, LoaderOptions options,
               BatchTransform batch_transform)
    : state_(std::make_unique<State>()) {
  if (!dataset) throw std::invalid_argument("Loader: no dataset");
  if (!transform) throw std::invalid_argument("Loader: no sample transform");
  if (options.batch_size <= 0) {
    throw std::invalid_argument("Loader: batch_size " + std::to_string(options.batch_size) + " must be positive");
  }
  if (options.world_size <= 0 || options.rank < 0 || options.rank >= options.world_size) {
    throw std::invalid_argument("Loader: rank " + std::to_string(options.rank) + " is not in [0, world_size " +
                                std::to_string(options.world_size) + ")");
  }
  if (options.num_workers < 0) {
    throw std::invalid_argument("Loader: num_workers " + std::to_string(options.num_workers) + " is negative");
  }
  options.prefetch = std::max<int64_t>(options.prefetch, 1);
  state_->dataset = std::move(dataset);
  state_->transform = std::move(transform);
  state_->batch_transform = std::move(batch_transform);
  state_->options = options;
  state_->pin = options.pin_memory && torch::cuda::is_available();
  for (int64_t i = 0; i < options.num_workers; ++i) state_->workers.emplace_back([this] { state_->work(); });
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;
  }
  state_->work_ready.notify_all();
  for (std::thread& worker : state_->workers) worker.join();
}

int64_t Loader::batches_per_epoch() const { return state_->batches(); }

void Loader::start_epoch(int64_t epoch, int64_t first_batch) {
  State& s = *state_;
  const int64_t end = s.batches();
  if (first_batch < 0 || first_batch > end) {
    throw std::invalid_argument("Loader: first_batch " + std::to_string(first_batch) + " is outside [0, " +
                                std::to_string(end) + "] (batches per epoch)");
  }
  std::shared_ptr<std::vector<int64_t>> order;
  std::shared_ptr<SampleStream> stream;
  if (const auto* streamed = dynamic_cast<const StreamDataset*>(s.dataset.get())) {
    const EpochLayout layout{s.options.seed, epoch, s.options.shuffle, s.options.batch_size, s.options.world_size};
    order = std::make_shared<std::vector<int64_t>>(streamed->epoch_order(layout));
    std::vector<int64_t> wanted;  // this rank's samples from first_batch on, in the order they are taken
    for (int64_t k = first_batch; k < end; ++k) {
      const auto [first, count] = s.positions(k);
      wanted.insert(wanted.end(), order->begin() + first, order->begin() + first + count);
    }
    stream = streamed->open_stream(layout, s.options.rank, wanted, (s.options.prefetch + 1) * s.options.batch_size);
  } else if (s.options.shuffle) {
    order = std::make_shared<std::vector<int64_t>>(
        seeded_permutation(s.dataset->size(), mix_seed({s.options.seed, static_cast<uint64_t>(epoch)})));
  } else {
    order = std::make_shared<std::vector<int64_t>>(s.dataset->size());
    std::iota(order->begin(), order->end(), 0);
  }
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    ++s.generation;
    s.epoch = epoch;
    s.order = std::move(order);
    s.stream = std::move(stream);  // a reader of an abandoned epoch stops once its last taker lets go
    s.next_claim = s.next_return = first_batch;
    s.end = end;
    s.ready.clear();
    s.started = true;
  }
  s.work_ready.notify_all();
}

std::optional<Batch> Loader::next() {
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mutex);
  if (!s.started) throw std::logic_error("Loader::next() called before start_epoch()");
  for (;;) {
    if (s.next_return >= s.end) return std::nullopt;
    const int64_t k = s.next_return;
    Slot slot;
    if (s.workers.empty()) {
      ++s.next_return;
      const int64_t epoch = s.epoch;
      const std::shared_ptr<const std::vector<int64_t>> order = s.order;
      const std::shared_ptr<SampleStream> stream = s.stream;
      lock.unlock();
      slot.batch = s.build(k, epoch, *order, stream.get());  // errors propagate directly
      lock.lock();
    } else {
      s.batch_ready.wait(lock, [&] { return s.ready.count(k) > 0; });
      const auto it = s.ready.find(k);
      slot = std::move(it->second);
      s.ready.erase(it);
      ++s.next_return;
      s.work_ready.notify_all();  // a slot in the prefetch window opened
    }
    if (slot.error) std::rethrow_exception(slot.error);
    if (!slot.batch.indices.empty()) return std::move(slot.batch);
  }
}

std::vector<std::string> Loader::bad_images() const {
  std::lock_guard<std::mutex> lock(state_->bad_mutex);
  return state_->bad;
}

}  // namespace vit
