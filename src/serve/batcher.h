// Dynamic batching for `vit serve`: the images of concurrent requests gathered into one batch of up to max_batch
// images, prepared (decoded) together across the intra-op threads and run as one forward pass, each request answered
// with its own rows. Admission bounds the requests in flight. No HTTP, no OpenCV: a request brings encoded items and
// the functions that prepare and run them.
//
// Everything heavy runs on the thread that calls run(), which should be the thread that loaded and warmed up the
// model, as vit predict runs (decode a batch on every core, then the model on every core):
// - libgomp keeps one pool of workers per thread that starts parallel regions, and once two pools exist on a machine
//   with as many cores as one pool has threads it stops spinning between regions, so every region of a forward pass
//   waits for sleeping workers: ViT-Ti/16 at batch 1 took 26-30 ms on a second thread against 14.5 ms on the first
//   (2 cores, 2 threads).
// - images decoded on other threads beside the model stall its OpenMP barriers, and the pool's workers spin on after
//   each pass while those threads want the cores: 52 img/s at 64 concurrent clients that way, against 67 img/s for
//   vit predict on the same files.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/types.h>

namespace vit {

struct BatcherOptions {
  int64_t max_batch = 32;  // images per forward pass (a request with more runs alone, max_batch at a time)
  // How long the oldest queued request may wait for admitted requests still arriving to join its batch. A batch never
  // waits when no other request is on its way: one caller alone is served at once.
  std::chrono::microseconds max_delay{5000};
  int64_t max_queue = 256;  // requests admitted and not yet answered (arriving, queued or running)
};

// admit() when max_queue requests are in flight, or after stop().
struct QueueFull : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A request item that could not be prepared (not an image, too large, ...): its message names the item. The request
// fails with it; the others of its batch still run.
struct BadItem : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One encoded input of a request (an image file's bytes) and the name its errors use.
struct BatchItem {
  std::string bytes;
  std::string name;
};

class Batcher {
 public:
  // An item to the model's input (C, H, W); throws (any exception: it becomes BadItem) when it cannot. Called on the
  // intra-op threads, several at once.
  using Prepare = std::function<torch::Tensor(const BatchItem& item)>;
  // One batch through the model: inputs (B, C, H, W) -> outputs, each with B rows in input order (or undefined).
  using Run = std::function<std::vector<torch::Tensor>(const torch::Tensor& inputs)>;
  // Told of every batch run: its images and the seconds of its forward pass (for metrics).
  using BatchObserver = std::function<void(int64_t images, double seconds)>;

  // A request's place in flight, from admission until it is answered (destroyed). Move-only.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept;
    Ticket& operator=(Ticket&& other) noexcept;
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket();

   private:
    friend class Batcher;
    explicit Ticket(Batcher* owner) : owner_(owner) {}
    void release();
    Batcher* owner_ = nullptr;
    bool submitted_ = false;
  };

  explicit Batcher(BatcherOptions options, BatchObserver observer = nullptr);
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // A place for one request; throws QueueFull when max_queue are in flight or the batcher is stopping.
  Ticket admit();
  // Queues an admitted request's items (at least one) for batching with others of the same `key` (the requests of
  // one batch share a key, `prepare` and `run`). The future holds run's outputs for this request's rows, or BadItem
  // for an item that could not be prepared, or run's exception. One submit per ticket.
  std::future<std::vector<torch::Tensor>> submit(Ticket& ticket, const std::string& key, std::vector<BatchItem> items,
                                                 Prepare prepare, Run run);
  // Requests admitted and not yet answered.
  int64_t in_flight() const;
  // Prepares and runs batches on the calling thread (in inference mode) until stop(), then every request already
  // submitted, and returns. Call it once.
  void run();
  // Refuses new tickets and submits (QueueFull) and lets run() return once the queue is empty. The server stops its
  // HTTP side first, so every admitted request has submitted by then. Idempotent; callable from any thread.
  void stop();

 private:
  struct Job {
    std::string key;
    std::vector<BatchItem> items;
    Prepare prepare;
    Run run;
    std::promise<std::vector<torch::Tensor>> answer;
    std::chrono::steady_clock::time_point queued;
  };
  void run_batch(std::vector<Job>& jobs);

  const BatcherOptions options_;
  BatchObserver observer_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Job> queue_;
  int64_t admitted_ = 0;    // live tickets
  int64_t on_the_way_ = 0;  // admitted, not yet submitted
  bool stopping_ = false;
};

}  // namespace vit
