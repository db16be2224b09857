// c10d-backed communicator and the single-process fallback. Compiles against Debian's libtorch 1.13 and LibTorch 2.x:
// only API common to both is used (ProcessGroupGloo/NCCL derive from ProcessGroup in 1.13 and from Backend in 2.x,
// with the same allreduce/broadcast/barrier signatures; Work is c10d::Work in both).
#include "train/distributed.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "util/log.h"
#include "vit/build_config.h"

// The imported torch target defines USE_C10D_GLOO (and USE_C10D_NCCL on CUDA builds) when libtorch has them; the
// Gloo headers themselves come with libtorch or, on Debian, with libgloo-dev.
#if VIT_WITH_DISTRIBUTED && defined(USE_C10D_GLOO) && __has_include(<gloo/config.h>)
#define VIT_HAVE_C10D 1
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#else
#define VIT_HAVE_C10D 0
#endif
// ProcessGroupNCCL.hpp includes <nccl.h>, which not every CUDA LibTorch ships: without it, CUDA ranks use Gloo.
#if VIT_HAVE_C10D && defined(USE_C10D_NCCL) && __has_include(<nccl.h>)
#define VIT_HAVE_NCCL 1
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#else
#define VIT_HAVE_NCCL 0
#endif

namespace vit {
namespace {

int env_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  try {
    size_t used = 0;
    const int parsed = std::stoi(value, &used);
    if (used == std::string(value).size()) return parsed;
  } catch (const std::exception&) {
  }
  throw std::invalid_argument(std::string("environment variable ") + name + "=\"" + value + "\" is not an integer");
}

// c10::Error's what() carries a C++ backtrace: our messages keep only its first part.
std::string reason(const std::exception& error) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) return c10_error->what_without_backtrace();
  return error.what();
}

std::string seconds_text(double seconds) {
  std::ostringstream text;
  text << seconds << " s";
  return text.str();
}

class LocalCommunicator final : public Communicator {
 public:
  struct Done final : Pending {
    void wait() override {}
  };
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::unique_ptr<Pending> start_all_reduce_sum(torch::Tensor) override { return std::make_unique<Done>(); }
  void broadcast(std::vector<torch::Tensor>&, int) override {}
  void barrier() override {}
};

#if VIT_HAVE_C10D
// One c10d process group; every collective waits with the group's timeout, so a dead or missing peer becomes an
// exception naming the operation instead of a hang. NCCL reduces only CUDA tensors: CPU tensors (evaluation counts,
// RNG states, stop flags) travel through a copy on `device`.
template <typename Group>
class C10dCommunicator final : public Communicator {
 public:
  C10dCommunicator(c10::intrusive_ptr<Group> group, int rank, int world_size, std::string backend,
                   torch::Device device)
      : group_(std::move(group)),
        rank_(rank),
        world_size_(world_size),
        backend_(std::move(backend)),
        device_(device) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  std::unique_ptr<Pending> start_all_reduce_sum(torch::Tensor tensor) override {
    auto pending = std::make_unique<InFlight>();
    pending->owner = this;
    pending->target = tensor;
    pending->staged = {stage(tensor)};
    pending->work = group_->allreduce(pending->staged);
    return pending;
  }
  void broadcast(std::vector<torch::Tensor>& tensors, int root) override {
    c10d::BroadcastOptions options;
    options.rootRank = root;
    for (auto& tensor : tensors) {
      std::vector<torch::Tensor> staged{stage(tensor)};
      wait(group_->broadcast(staged, options), "broadcast");
      unstage(staged[0], tensor);
    }
  }
  void barrier() override {
    if (backend_ == "nccl") {
      // NCCL's barrier guesses the device from the rank, which is wrong on multi-node jobs: a tiny all-reduce on
      // our own device synchronises just as well.
      auto token = torch::zeros({1}, torch::TensorOptions().device(device_));
      start_all_reduce_sum(token)->wait();
      token.cpu();
      return;
    }
    wait(group_->barrier(), "barrier");
  }

 private:
  struct InFlight final : Pending {
    C10dCommunicator* owner = nullptr;
    torch::Tensor target;
    std::vector<torch::Tensor> staged;  // what the collective reads and writes; alive until wait()
    c10::intrusive_ptr<c10d::Work> work;
    void wait() override {
      owner->wait(work, "all-reduce");
      unstage(staged[0], target);
    }
  };

  torch::Tensor stage(const torch::Tensor& tensor) const {
    if (backend_ == "nccl" && !tensor.is_cuda()) return tensor.to(device_);
    return tensor;
  }
  static void unstage(const torch::Tensor& staged, torch::Tensor& tensor) {
    if (!staged.is_same(tensor)) tensor.copy_(staged);
  }
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what) {
    try {
      work->wait();
    } catch (const std::exception& e) {
      throw std::runtime_error("rank " + std::to_string(rank_) + " of " + std::to_string(world_size_) + ": " +
                               backend_ + " " + what + " failed (a peer died, or did not answer within " +
                               VIT_TRAIN_KEY(dist_timeout_s) + "): " + reason(e));
    }
  }

  c10::intrusive_ptr<Group> group_;
  int rank_, world_size_;
  std::string backend_;
  torch::Device device_;
};

// The address Gloo binds its sockets to. GLOO_SOCKET_IFNAME (comma-separated interfaces) wins, as in PyTorch;
// otherwise the address on the route to the master, which unlike the host name's address (Debian maps the host
// name to 127.0.1.1) is one the other machines can reach.
std::vector<std::shared_ptr<::gloo::transport::Device>> gloo_devices(const std::string& master_addr) {
  std::vector<std::shared_ptr<::gloo::transport::Device>> devices;
  if (const char* interfaces = std::getenv("GLOO_SOCKET_IFNAME"); interfaces != nullptr && *interfaces != '\0') {
    std::string list = interfaces;
    for (size_t start = 0; start <= list.size();) {
      const size_t end = std::min(list.find(',', start), list.size());
      const std::string name = list.substr(start, end - start);
      if (!name.empty()) {
        try {
          devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
        } catch (const std::exception& e) {
          throw std::runtime_error("GLOO_SOCKET_IFNAME=" + list + ": cannot use interface \"" + name +
                                   "\": " + reason(e));
        }
      }
      start = end + 1;
    }
    return devices;
  }
  const std::string address = local_address_towards(master_addr);
  if (!address.empty()) {
    try {
      devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(address));
      log::info("gloo uses " + address + " (the route to MASTER_ADDR=" + master_addr + ")");
      return devices;
    } catch (const std::exception& e) {
      log::warn("gloo cannot bind " + address + " (the route to MASTER_ADDR=" + master_addr + "): " + reason(e) +
                "; falling back to the host name's address");
    }
  }
  devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  return devices;
}

#if VIT_HAVE_NCCL
// NCCL collectives are asynchronous on the GPU: blocking wait makes Work::wait() block and throw once the timeout
// passes, instead of leaving a hung kernel behind. Set only when the user has not chosen.
void request_nccl_blocking_wait() {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
  ::setenv("TORCH_NCCL_BLOCKING_WAIT", "1", /*overwrite=*/0);
#else
  ::setenv("NCCL_BLOCKING_WAIT", "1", /*overwrite=*/0);
#endif
}
#endif
#endif  // VIT_HAVE_C10D

}  // namespace

DistEnv dist_env_from_environment() {
  DistEnv env;
  env.world_size = env_int("WORLD_SIZE", 1);
  env.rank = env_int("RANK", 0);
  env.local_rank = env_int("LOCAL_RANK", env.rank);
  if (const char* addr = std::getenv("MASTER_ADDR"); addr != nullptr && *addr != '\0') env.master_addr = addr;
  env.master_port = env_int("MASTER_PORT", env.master_port);
  if (env.world_size < 1) {
    throw std::invalid_argument("WORLD_SIZE=" + std::to_string(env.world_size) + " must be at least 1");
  }
  if (env.rank < 0 || env.rank >= env.world_size) {
    throw std::invalid_argument("RANK=" + std::to_string(env.rank) + " is not in [0, WORLD_SIZE=" +
                                std::to_string(env.world_size) + ")");
  }
  if (env.local_rank < 0) throw std::invalid_argument("LOCAL_RANK=" + std::to_string(env.local_rank) + " is negative");
  if (env.master_port < 1 || env.master_port > 65535) {
    throw std::invalid_argument("MASTER_PORT=" + std::to_string(env.master_port) + " is not a TCP port (1-65535)");
  }
  return env;
}

std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &found) != 0) return "";
  std::string address;
  for (addrinfo* candidate = found; candidate != nullptr && address.empty(); candidate = candidate->ai_next) {
    const int fd = ::socket(candidate->ai_family, candidate->ai_socktype, candidate->ai_protocol);
    if (fd < 0) continue;
    // Connecting a UDP socket sends nothing; it only makes the kernel choose the route and the source address.
    sockaddr_storage local{};
    socklen_t length = sizeof local;
    if (::connect(fd, candidate->ai_addr, candidate->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
      char text[INET6_ADDRSTRLEN] = {};
      const void* raw = local.ss_family == AF_INET
                            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                            : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (::inet_ntop(local.ss_family, raw, text, sizeof text) != nullptr) address = text;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return address;
}

std::unique_ptr<Communicator> make_local_communicator() { return std::make_unique<LocalCommunicator>(); }

std::unique_ptr<Communicator> make_communicator(const DistEnv& env, const TrainConfig& train,
                                                const torch::Device& device) {
  if (env.world_size <= 1) return make_local_communicator();
  return join_process_group(env, train, device);
}

std::unique_ptr<Communicator> join_process_group(const DistEnv& env, const TrainConfig& train,
                                                 const torch::Device& device) {
#if VIT_HAVE_C10D
  std::string backend = name_of(train.dist_backend);
  if (train.dist_backend == DistBackend::automatic) {
    backend = device.is_cuda() && VIT_HAVE_NCCL ? "nccl" : "gloo";
    if (device.is_cuda() && backend == "gloo") log::warn("this vit has no NCCL: CUDA gradients are reduced by gloo");
  }
  const std::string who = "rank " + std::to_string(env.rank) + " of " + std::to_string(env.world_size);
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(train.dist_timeout_s * 1000.0));
  log::info("joining the " + backend + " group as " + who + " via " + where);

  // Rank 0 serves the store. Every rank counts itself in and waits for the count to reach WORLD_SIZE: one deadline
  // for the whole rendezvous, and an error that says how many ranks came.
  const std::string hint = " (start every rank with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE)";
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(env.master_port);
  store_options.isServer = env.rank == 0;
  store_options.numWorkers = static_cast<size_t>(env.world_size);
  store_options.waitWorkers = false;
  store_options.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
    for (int64_t arrived = store->add("vit/arrived", 1); arrived < env.world_size;
         arrived = store->add("vit/arrived", 0)) {
      if (std::chrono::steady_clock::now() >= deadline) {
        throw std::runtime_error("only " + std::to_string(arrived) + " of " + std::to_string(env.world_size) +
                                 " ranks arrived");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const std::exception& e) {
    throw std::runtime_error(who + ": rendezvous at " + where + " failed within " + VIT_TRAIN_KEY(dist_timeout_s) +
                             "=" + seconds_text(train.dist_timeout_s) + ": " + reason(e) + hint);
  }

  if (backend == "nccl") {
#if VIT_HAVE_NCCL
    if (!device.is_cuda()) {
      throw std::invalid_argument(VIT_TRAIN_KEY(dist_backend) + " nccl needs a CUDA device, but training runs on " +
                                  device.str() + " (use gloo)");
    }
    request_nccl_blocking_wait();
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = timeout;
    c10::intrusive_ptr<c10d::ProcessGroupNCCL> group;
    try {
      group = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, env.rank, env.world_size, options);
    } catch (const std::exception& e) {
      throw std::runtime_error(who + ": nccl group did not form: " + reason(e));
    }
    return std::make_unique<C10dCommunicator<c10d::ProcessGroupNCCL>>(group, env.rank, env.world_size, "nccl",
                                                                      device);
#else
    throw std::invalid_argument(
        VIT_TRAIN_KEY(dist_backend) +
        " nccl: this vit was built against a libtorch without NCCL (or without nccl.h); use gloo");
#endif
  }

  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices = gloo_devices(env.master_addr);
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
  try {
    group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, env.rank, env.world_size, options);
  } catch (const std::exception& e) {
    throw std::runtime_error(who + ": gloo group did not form within " + VIT_TRAIN_KEY(dist_timeout_s) + "=" +
                             seconds_text(train.dist_timeout_s) + ": " + reason(e));
  }
  return std::make_unique<C10dCommunicator<c10d::ProcessGroupGloo>>(group, env.rank, env.world_size, "gloo",
                                                                    torch::Device(torch::kCPU));
#else
  throw std::runtime_error("WORLD_SIZE=" + std::to_string(env.world_size) +
                           ": this vit was built without c10d (VIT_WITH_DISTRIBUTED=OFF, or a libtorch without "
                           "Gloo or its headers); multi-process training is unavailable");
#endif
}

void Communicator::all_reduce_sum(std::vector<torch::Tensor>& tensors) {
  std::vector<std::unique_ptr<Pending>> pending;
  for (auto& tensor : tensors) pending.push_back(start_all_reduce_sum(tensor));
  for (auto& work : pending) work->wait();
}

std::vector<double> sum_over_ranks(Communicator& comm, std::vector<double> values) {
  if (comm.world_size() <= 1 || values.empty()) return values;
  std::vector<torch::Tensor> sums{torch::tensor(values, torch::kFloat64)};
  comm.all_reduce_sum(sums);
  const auto summed = sums[0].contiguous();
  return std::vector<double>(summed.data_ptr<double>(), summed.data_ptr<double>() + summed.numel());
}


struct GradientReducer::State {
  struct Bucket {
    int64_t offset = 0, size = 0;  // elements of the flat buffer
    int64_t params = 0;            // parameters in it
    int64_t waiting = 0;           // of those, not yet final in this backward
    std::unique_ptr<Communicator::Pending> pending;
  };
  Communicator* comm = nullptr;  // null once the reducer is gone (the hooks stay registered on the parameters)
  torch::Tensor flat;
  std::vector<Bucket> buckets;     // in start order
  std::vector<int64_t> bucket_of;  // parameter (buffer order) -> bucket
  size_t next = 0;                 // next bucket to start
  size_t started_early = 0;        // buckets started by hooks in the last armed backward
  int64_t previous = -1;           // parameter whose hook ran last in this backward
  bool armed = false;

  // A leaf's hook runs just before autograd accumulates its gradient, and autograd runs one node at a time per
  // device: when parameter i's hook runs, the previous parameter's gradient is final.
  void on_gradient(int64_t parameter) {
    if (comm == nullptr || !armed) return;
    settle_previous();
    previous = parameter;
    while (next < buckets.size() && buckets[next].waiting == 0) start(next++);
  }
  void settle_previous() {
    if (previous >= 0) --buckets[bucket_of[previous]].waiting;
    previous = -1;
  }
  void start(size_t b) {
    buckets[b].pending = comm->start_all_reduce_sum(flat.narrow(0, buckets[b].offset, buckets[b].size));
  }
};

GradientReducer::GradientReducer(Communicator& comm, torch::Tensor flat_grads,
                                 const std::vector<std::pair<std::string, torch::Tensor>>& buffer_order,
                                 const std::vector<std::pair<std::string, torch::Tensor>>& model_order,
                                 int64_t bucket_bytes)
    : state_(std::make_shared<State>()) {
  state_->comm = &comm;
  state_->flat = flat_grads;
  if (comm.world_size() <= 1) return;  // nothing to reduce: no hooks, no buckets
  std::map<std::string, int64_t> model_index;
  for (size_t i = 0; i < model_order.size(); ++i) model_index[model_order[i].first] = static_cast<int64_t>(i);
  auto index_of = [&](const std::string& name) {
    const auto found = model_index.find(name);
    if (found == model_index.end()) {
      throw std::invalid_argument("GradientReducer: " + name + " is not a model parameter");
    }
    return found->second;
  };

  // Runs of the buffer that are in model order (FlatAdamW puts the decay group first, then the no-decay group),
  // cut into buckets of about bucket_bytes; a bucket's gradients are all final once its earliest layer's are.
  struct Planned {
    State::Bucket bucket;
    int64_t first_layer = 0;
  };
  std::vector<Planned> planned;
  const int64_t element_bytes = static_cast<int64_t>(flat_grads.element_size());
  int64_t offset = 0, previous_index = -1;
  for (const auto& [name, parameter] : buffer_order) {
    const int64_t index = index_of(name);
    const int64_t n = parameter.numel();
    const bool new_run = index < previous_index;
    if (planned.empty() || new_run || planned.back().bucket.size * element_bytes >= bucket_bytes) {
      planned.push_back({});
      planned.back().bucket.offset = offset;
      planned.back().first_layer = index;
    }
    auto& current = planned.back();
    current.bucket.size += n;
    ++current.bucket.params;
    current.first_layer = std::min(current.first_layer, index);
    state_->bucket_of.push_back(static_cast<int64_t>(planned.size()) - 1);
    offset += n;
    previous_index = index;
  }
  if (offset != flat_grads.numel()) {
    throw std::invalid_argument("GradientReducer: the parameters cover " + std::to_string(offset) +
                                " gradient elements, the buffer has " + std::to_string(flat_grads.numel()));
  }
  // Start order: latest first layer first (backward reaches it first); the same on every rank.
  std::vector<size_t> order(planned.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return planned[a].first_layer > planned[b].first_layer;
  });
  std::vector<int64_t> position(planned.size());
  for (size_t i = 0; i < order.size(); ++i) {
    position[order[i]] = static_cast<int64_t>(i);
    state_->buckets.push_back(std::move(planned[order[i]].bucket));
  }
  for (auto& b : state_->bucket_of) b = position[b];

  for (size_t i = 0; i < buffer_order.size(); ++i) {
    torch::Tensor parameter = buffer_order[i].second;
    std::shared_ptr<State> state = state_;
    parameter.register_hook([state, i](const torch::Tensor&) { state->on_gradient(static_cast<int64_t>(i)); });
  }
}

GradientReducer::~GradientReducer() {
  state_->comm = nullptr;
  state_->flat = torch::Tensor();
  state_->buckets.clear();
}

int64_t GradientReducer::buckets() const { return static_cast<int64_t>(state_->buckets.size()); }
int64_t GradientReducer::started_during_backward() const { return static_cast<int64_t>(state_->started_early); }

void GradientReducer::arm() {
  State& s = *state_;
  if (s.comm->world_size() <= 1) return;
  for (auto& bucket : s.buckets) {
    bucket.waiting = bucket.params;
    bucket.pending.reset();
  }
  s.next = 0;
  s.previous = -1;
  s.armed = true;
}

void GradientReducer::finish() {
  State& s = *state_;
  if (s.comm->world_size() <= 1) return;
  if (!s.armed) arm();
  s.settle_previous();
  s.armed = false;
  s.started_early = s.next;
  // Buckets whose gradients backward never touched (unused parameters) start here, still in the agreed order.
  while (s.next < s.buckets.size()) s.start(s.next++);
  for (auto& bucket : s.buckets) {
    bucket.pending->wait();
    bucket.pending.reset();
  }
  s.flat.div_(s.comm->world_size());
}

}  // namespace vit
