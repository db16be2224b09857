// Multi-process data parallelism on PyTorch's c10d (TCPStore rendezvous; Gloo on CPU, NCCL on CUDA), configured
// from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "config/config.h"

namespace vit {

// Where this process sits in the job, from the environment (world_size 1 when WORLD_SIZE is unset).
struct DistEnv {
  int rank = 0;        // RANK: this process among all processes of the job
  int world_size = 1;  // WORLD_SIZE: processes in the job
  int local_rank = 0;  // LOCAL_RANK: this process among those on its machine (its CUDA device); default RANK
  std::string master_addr = "127.0.0.1";  // MASTER_ADDR: the host of rank 0, which serves the rendezvous store
  int master_port = 29500;                // MASTER_PORT
};
// Throws std::invalid_argument naming the variable when one is malformed or inconsistent.
DistEnv dist_env_from_environment();

// Collectives over the ranks of one job. Every rank must call the same collectives in the same order; a peer that
// died or stopped answering turns a collective into an exception (after train.dist_timeout_s at most), never a hang.
class Communicator {
 public:
  // A collective in flight; wait() completes it (and throws if it failed).
  class Pending {
   public:
    virtual ~Pending() = default;
    virtual void wait() = 0;
  };

  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  bool is_main() const { return rank() == 0; }
  // Starts an in-place sum over ranks of `tensor`; its result is there once wait() returned.
  virtual std::unique_ptr<Pending> start_all_reduce_sum(torch::Tensor tensor) = 0;
  // In-place sum over ranks of each tensor; all of them are in flight together (pass buckets, not parameters).
  void all_reduce_sum(std::vector<torch::Tensor>& tensors);
  // In-place copy of rank `root`'s tensors to every rank.
  virtual void broadcast(std::vector<torch::Tensor>& tensors, int root) = 0;
  virtual void barrier() = 0;
};

// A world of one: every collective is a no-op.
std::unique_ptr<Communicator> make_local_communicator();
// Joins the process group described by `env` (world_size > 1), choosing the backend from train.dist_backend and the
// device; a peer that never arrives or dies fails collectives after train.dist_timeout_s with a clear error.
std::unique_ptr<Communicator> make_communicator(const DistEnv& env, const TrainConfig& train,
                                                const torch::Device& device);
// The same, but always through c10d, even for a world of one (make_communicator's no-op shortcut): checks a
// backend on one machine, e.g. NCCL on a single GPU.
std::unique_ptr<Communicator> join_process_group(const DistEnv& env, const TrainConfig& train,
                                                 const torch::Device& device);

// Averages the gradients over ranks, as a bucketed all-reduce, but starts each bucket's all-reduce during backward, as
// soon as autograd has finished every gradient in it (DDP's overlap of communication with the rest of backward).
// Buckets are runs of whole parameters, contiguous in the flat gradient buffer; they start in one order fixed by the
// model (latest layers first), so that every rank issues the same collectives in the same sequence.
class GradientReducer {
 public:
  // `buffer_order`: the parameters as laid out in `flat_grads` (FlatAdamW::named()); `model_order`: the module's
  // named_parameters(), whose reverse is roughly the order in which backward finishes gradients.
  GradientReducer(Communicator& comm, torch::Tensor flat_grads,
                  const std::vector<std::pair<std::string, torch::Tensor>>& buffer_order,
                  const std::vector<std::pair<std::string, torch::Tensor>>& model_order,
                  int64_t bucket_bytes = 25 << 20);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Call before the backward that completes the step's gradients (the last micro-batch): its hooks then start
  // buckets as they fill. Without it, finish() is a plain bucketed all-reduce.
  void arm();
  // Starts the buckets not yet started, waits for all of them, divides by the world size.
  void finish();
  int64_t buckets() const;
  // Of those, how many the last finish() found already started by backward (the overlap achieved).
  int64_t started_during_backward() const;

 private:
  struct State;
  std::shared_ptr<State> state_;  // shared with the autograd hooks, which outlive nothing but may outlive us
};

// Sums a few per-step numbers (a loss, a stop flag) over ranks in one small all-reduce, so that every rank takes the
// same decision from them; returns `values` unchanged in a world of one.
std::vector<double> sum_over_ranks(Communicator& comm, std::vector<double> values);

// This host's address on the route to `host` (the address peers can reach it at, for Gloo's sockets); "" when the
// route cannot be determined.
std::string local_address_towards(const std::string& host);

}  // namespace vit
