// c10d-backed communicator and the single-process fallback.
#include "train/distributed.h"

#include <cstdlib>
#include <stdexcept>

#include "vit/build_config.h"

namespace vit {
namespace {

int env_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  try {
    return std::stoi(value);
  } catch (const std::exception&) {
    throw std::invalid_argument(std::string("environment variable ") + name + "=\"" + value + "\" is not an integer");
  }
}

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  void all_reduce_sum(std::vector<torch::Tensor>&) override {}
  void broadcast(std::vector<torch::Tensor>&, int) override {}
  void barrier() override {}
};

}  // namespace

DistEnv dist_env_from_environment() {
  DistEnv env;
  env.world_size = env_int("WORLD_SIZE", 1);
  env.rank = env_int("RANK", 0);
  env.local_rank = env_int("LOCAL_RANK", env.rank);
  if (const char* addr = std::getenv("MASTER_ADDR")) env.master_addr = addr;
  env.master_port = env_int("MASTER_PORT", env.master_port);
  if (env.world_size < 1 || env.rank < 0 || env.rank >= env.world_size) {
    throw std::invalid_argument("RANK=" + std::to_string(env.rank) + " is not in [0, WORLD_SIZE=" +
                                std::to_string(env.world_size) + ")");
  }
  return env;
}

std::unique_ptr<Communicator> make_local_communicator() { return std::make_unique<LocalCommunicator>(); }

std::unique_ptr<Communicator> make_communicator(const DistEnv& env, const TrainConfig& train,
                                                const torch::Device& device) {
  if (env.world_size <= 1) return make_local_communicator();
  throw std::runtime_error("WORLD_SIZE=" + std::to_string(env.world_size) +
                           ": multi-process training is not available in this build");
}

void all_reduce_mean(Communicator& comm, torch::Tensor& flat, int64_t bucket_bytes) {
  if (comm.world_size() <= 1) return;
  const int64_t per_bucket = std::max<int64_t>(1, bucket_bytes / static_cast<int64_t>(flat.element_size()));
  std::vector<torch::Tensor> buckets;
  for (int64_t start = 0; start < flat.numel(); start += per_bucket) {
    buckets.push_back(flat.narrow(0, start, std::min(per_bucket, flat.numel() - start)));
  }
  comm.all_reduce_sum(buckets);
  flat.div_(comm.world_size());
}

}  // namespace vit
