// Dynamic batching: the thread in run() gathers queued requests of one key into batches, prepares their items in
// parallel and runs them.
#include "serve/batcher.h"

#include <algorithm>
#include <exception>
#include <utility>

#include <ATen/Parallel.h>
#include <torch/torch.h>


namespace vit {

Batcher::Ticket::Ticket(Ticket&& other) noexcept : owner_(other.owner_), submitted_(other.submitted_) {
  other.owner_ = nullptr;
}

Batcher::Ticket& Batcher::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    release();
    owner_ = std::exchange(other.owner_, nullptr);
    submitted_ = other.submitted_;
  }
  return *this;
}

Batcher::Ticket::~Ticket() { release(); }

void Batcher::Ticket::release() {
  if (owner_ == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(owner_->mutex_);
    --owner_->admitted_;
    if (!submitted_) --owner_->on_the_way_;
  }
  owner_->changed_.notify_all();  // a batch waiting for this request need not wait any longer
  owner_ = nullptr;
}

Batcher::Batcher(BatcherOptions options, BatchObserver observer)
    : options_(options), observer_(std::move(observer)) {
  if (options_.max_batch <= 0 || options_.max_queue <= 0 || options_.max_delay.count() < 0) {
    throw std::invalid_argument("batcher: max batch " + std::to_string(options_.max_batch) + " and max queue " +
                                std::to_string(options_.max_queue) + " must be positive, the delay not negative");
  }
}

Batcher::Ticket Batcher::admit() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_) throw QueueFull("the server is shutting down");
  if (admitted_ >= options_.max_queue) {
    throw QueueFull("the server is at capacity: " + std::to_string(admitted_) + " requests in flight (--max-queue " +
                    std::to_string(options_.max_queue) + ")");
  }
  ++admitted_;
  ++on_the_way_;
  return Ticket(this);
}

std::future<std::vector<torch::Tensor>> Batcher::submit(Ticket& ticket, const std::string& key,
                                                        std::vector<BatchItem> items, Prepare prepare, Run run) {
  if (ticket.owner_ != this || ticket.submitted_) {
    throw std::logic_error("batcher: submit needs a ticket of this batcher, once");
  }
  if (items.empty()) throw std::invalid_argument("batcher: a request needs at least one item");
  Job job;
  job.key = key;
  job.items = std::move(items);
  job.prepare = std::move(prepare);
  job.run = std::move(run);
  job.queued = std::chrono::steady_clock::now();
  auto answer = job.answer.get_future();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) throw QueueFull("the server is shutting down");
    ticket.submitted_ = true;
    --on_the_way_;
    queue_.push_back(std::move(job));
  }
  changed_.notify_all();
  return answer;
}

int64_t Batcher::in_flight() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return admitted_;
}

void Batcher::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
}

void Batcher::run() {
  c10::InferenceMode inference;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return !queue_.empty() || stopping_; });
    if (queue_.empty()) return;  // stopping, and every submitted request has run
    // The batch: queued requests of the oldest one's key, in order, while they fit. It waits for more only while
    // admitted requests are still on their way (being read or decoded) and the oldest has waited under max_delay.
    const auto deadline = queue_.front().queued + options_.max_delay;
    std::vector<size_t> picked;
    for (;;) {
      picked.clear();
      int64_t images = 0;
      for (size_t i = 0; i < queue_.size(); ++i) {
        if (queue_[i].key != queue_.front().key) continue;
        const auto n = static_cast<int64_t>(queue_[i].items.size());
        if (!picked.empty() && images + n > options_.max_batch) break;
        picked.push_back(i);
        images += n;
      }
      if (images >= options_.max_batch || on_the_way_ == 0 || stopping_ ||
          std::chrono::steady_clock::now() >= deadline) {
        break;
      }
      changed_.wait_until(lock, deadline);
    }
    std::vector<Job> jobs;
    for (const size_t i : picked) jobs.push_back(std::move(queue_[i]));
    for (auto it = picked.rbegin(); it != picked.rend(); ++it) queue_.erase(queue_.begin() + *it);
    lock.unlock();
    run_batch(jobs);
    lock.lock();
  }
}

void Batcher::run_batch(std::vector<Job>& jobs) {
  // Every item of the batch prepared across the intra-op threads, one item per task (as vit predict decodes).
  std::vector<std::pair<size_t, size_t>> where;  // (job, item) of each flat index
  for (size_t j = 0; j < jobs.size(); ++j) {
    for (size_t i = 0; i < jobs[j].items.size(); ++i) where.emplace_back(j, i);
  }
  std::vector<torch::Tensor> prepared(where.size());
  std::vector<std::string> errors(where.size());
  at::parallel_for(0, static_cast<int64_t>(where.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const auto [j, i] = where[k];
      try {
        prepared[k] = jobs[j].prepare(jobs[j].items[i]);
      } catch (const std::exception& e) {
        errors[k] = e.what()[0] ? e.what() : jobs[j].items[i].name + ": could not be prepared";
      }
    }
  });
  // A request with an item that failed is answered with its first error; the others run.
  std::vector<Job*> running;
  std::vector<torch::Tensor> inputs;
  for (size_t k = 0; k < where.size();) {
    Job& job = jobs[where[k].first];
    const size_t n = job.items.size();
    const auto failed = std::find_if(errors.begin() + k, errors.begin() + k + n, [](const std::string& e) {
      return !e.empty();
    });
    if (failed != errors.begin() + k + n) {
      job.answer.set_exception(std::make_exception_ptr(BadItem(*failed)));
    } else {
      running.push_back(&job);
      inputs.insert(inputs.end(), prepared.begin() + k, prepared.begin() + k + n);
    }
    k += n;
  }
  prepared.clear();
  if (running.empty()) return;

  try {
    const auto start = std::chrono::steady_clock::now();
    const torch::Tensor batch = torch::stack(inputs);
    inputs.clear();
    // A lone request larger than max_batch runs max_batch images at a time.
    std::vector<std::vector<torch::Tensor>> parts;
    for (int64_t begin = 0; begin < batch.size(0); begin += options_.max_batch) {
      const int64_t n = std::min(options_.max_batch, batch.size(0) - begin);
      parts.push_back(running.front()->run(batch.narrow(0, begin, n)));
    }
    std::vector<torch::Tensor> outputs = parts.front();
    if (parts.size() > 1) {
      for (size_t k = 0; k < outputs.size(); ++k) {
        if (!outputs[k].defined()) continue;  // an output the model does not have (no head: no class)
        std::vector<torch::Tensor> pieces;
        for (const auto& part : parts) pieces.push_back(part[k]);
        outputs[k] = torch::cat(pieces);
      }
    }
    if (observer_) {
      observer_(batch.size(0), std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    int64_t row = 0;
    for (Job* job : running) {
      const auto n = static_cast<int64_t>(job->items.size());
      std::vector<torch::Tensor> mine;
      for (const auto& output : outputs) mine.push_back(output.defined() ? output.narrow(0, row, n) : output);
      row += n;
      job->answer.set_value(std::move(mine));
    }
  } catch (...) {
    for (Job* job : running) {
      try {
        job->answer.set_exception(std::current_exception());
      } catch (const std::future_error&) {  // answered before the failure
      }
    }
  }
}

}  // namespace vit
