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
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};
DistEnv dist_env_from_environment();

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  bool is_main() const { return rank() == 0; }
  // In-place sum over ranks of each tensor (flat buffers; bucketed by the caller or the implementation).
  virtual void all_reduce_sum(std::vector<torch::Tensor>& tensors) = 0;
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

// Averages a flat gradient buffer over ranks in buckets of about `bucket_bytes`.
void all_reduce_mean(Communicator& comm, torch::Tensor& flat, int64_t bucket_bytes = 25 << 20);

}  // namespace vit
