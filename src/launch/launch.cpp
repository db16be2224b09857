// `vit launch`'s supervisor: fork/exec of the ranks, their output through pipes and poll(), signals through a pipe.
#include "launch/launch.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "util/log.h"

extern char** environ;

namespace vit {
namespace {

using Clock = std::chrono::steady_clock;

// The statuses launch gives meaning to (the CLI's kOk, kError, kInterrupted).
constexpr int kSuccess = 0;
constexpr int kFailure = 1;
constexpr int kStopped = 130;  // stopped by SIGINT/SIGTERM, state saved

// Signals arrive through a pipe, so the main loop sees them in poll() next to the ranks' output.
int signal_pipe[2] = {-1, -1};
std::atomic<bool> launch_running{false};
extern "C" void on_launch_signal(int signal) {
  const int saved = errno;
  const unsigned char number = static_cast<unsigned char>(signal);
  [[maybe_unused]] const ssize_t written = ::write(signal_pipe[1], &number, 1);
  errno = saved;
}

std::string errno_text() { return std::strerror(errno); }

// "exit status 1", "killed by signal 9 (Killed)".
std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  }
  return "status " + std::to_string(status);
}

// The shell convention: the exit code, or 128 + the signal that killed it.
int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return kFailure;
}

void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // our own output is gone (closed pipe): nothing sensible left to do with it
    done += static_cast<size_t>(n);
  }
}

// One output stream (stdout or stderr) of one rank: bytes in, prefixed whole lines out.
struct Stream {
  int fd = -1;          // read end of the pipe; -1 once closed
  int target = 1;       // the fd the lines go to
  std::string prefix;   // "0: "
  std::string partial;  // bytes after the last newline

  void emit(bool flush_partial) {
    size_t start = 0;
    std::string out;
    for (size_t newline; (newline = partial.find('\n', start)) != std::string::npos; start = newline + 1) {
      out += prefix + partial.substr(start, newline + 1 - start);
    }
    partial.erase(0, start);
    if (flush_partial && !partial.empty()) {
      out += prefix + partial + "\n";
      partial.clear();
    }
    if (!out.empty()) write_all(target, out);
  }
  // Reads what is available; false at end of file.
  bool read_some() {
    char buffer[65536];
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    if (n <= 0) {
      ::close(fd);
      fd = -1;
      emit(/*flush_partial=*/true);
      return false;
    }
    partial.append(buffer, static_cast<size_t>(n));
    emit(/*flush_partial=*/false);
    return true;
  }
};

struct Rank {
  pid_t pid = -1;
  std::optional<int> status;  // set once reaped
  Stream out, err;
};

void check_request(const LaunchRequest& request) {
  if (request.nproc < 1 || request.nproc > 1024) {
    throw std::invalid_argument("vit launch: nproc " + std::to_string(request.nproc) + " is outside [1, 1024]");
  }
  if (request.master_addr.empty()) throw std::invalid_argument("vit launch: master_addr is empty");
  if (request.master_port < 0 || request.master_port > 65535) {
    throw std::invalid_argument("vit launch: master_port " + std::to_string(request.master_port) +
                                " is outside [0, 65535]");
  }
  if (!std::isfinite(request.grace_s) || request.grace_s < 0) {
    std::ostringstream grace;
    grace << request.grace_s;
    throw std::invalid_argument("vit launch: grace " + grace.str() + " s is not a number of seconds >= 0");
  }
  if (request.argv.empty() || request.argv[0].empty()) {
    throw std::invalid_argument("vit launch: no command to run in the ranks");
  }
}

std::vector<std::string> child_environment(int rank, const LaunchRequest& request, int port) {
  const std::vector<std::string> ours = {
      "RANK=" + std::to_string(rank),          "LOCAL_RANK=" + std::to_string(rank),
      "WORLD_SIZE=" + std::to_string(request.nproc), "LOCAL_WORLD_SIZE=" + std::to_string(request.nproc),
      "GROUP_RANK=0",                          "MASTER_ADDR=" + request.master_addr,
      "MASTER_PORT=" + std::to_string(port)};
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string item = *entry;
    const std::string key = item.substr(0, item.find('='));
    bool replaced = false;
    for (const auto& set : ours) replaced = replaced || set.compare(0, key.size() + 1, key + "=") == 0;
    if (!replaced) environment.push_back(item);
  }
  environment.insert(environment.end(), ours.begin(), ours.end());
  return environment;
}

Rank start_rank(int rank, const LaunchRequest& request, int port) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    throw std::runtime_error("vit launch: pipe() for rank " + std::to_string(rank) + " failed: " + errno_text());
  }
  // Everything execve needs is built before fork: the child of a threaded process may only call async-signal-safe
  // functions.
  const std::string& executable = request.argv[0];
  const std::vector<std::string> environment = child_environment(rank, request, port);
  std::vector<char*> argv, envp;
  for (const auto& a : request.argv) argv.push_back(const_cast<char*>(a.c_str()));
  for (const auto& e : environment) envp.push_back(const_cast<char*>(e.c_str()));
  argv.push_back(nullptr);
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();
  const std::string exec_failed = "vit launch: cannot execute " + executable + "\n";

  const pid_t pid = ::fork();
  if (pid < 0) {
    throw std::runtime_error("vit launch: fork() for rank " + std::to_string(rank) + " failed: " + errno_text());
  }
  if (pid == 0) {
    // If the launcher dies (even by SIGKILL), the rank gets SIGTERM: it saves its state and stops with the others.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(kStopped);
    ::signal(SIGPIPE, SIG_DFL);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    ::execve(executable.c_str(), argv.data(), envp.data());
    [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, exec_failed.data(), exec_failed.size());
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  Rank started;
  started.pid = pid;
  started.out = {out[0], request.stdout_fd, std::to_string(rank) + ": ", ""};
  started.err = {err[0], request.stderr_fd, std::to_string(rank) + ": ", ""};
  return started;
}

void signal_running(std::vector<Rank>& ranks, int signal) {
  for (auto& rank : ranks) {
    if (!rank.status) ::kill(rank.pid, signal);
  }
}

// For the length of one launch: the signal pipe and handlers; on the way out (normal or not) the previous handlers
// come back, and ranks still running are killed and reaped.
class Supervision {
 public:
  explicit Supervision(std::vector<Rank>& ranks) : ranks_(ranks) {
    if (launch_running.exchange(true)) throw std::runtime_error("vit launch: a launch is already running here");
    if (::pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
      launch_running = false;
      throw std::runtime_error("vit launch: pipe() for signals failed: " + errno_text());
    }
    struct sigaction action {};
    action.sa_handler = on_launch_signal;
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < 3; ++i) ::sigaction(kForwarded[i], &action, &previous_[i]);
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;  // a rank's pipe closing must not kill the launcher
    sigemptyset(&ignore.sa_mask);
    ::sigaction(SIGPIPE, &ignore, &previous_[3]);
  }
  ~Supervision() {
    signal_running(ranks_, SIGKILL);
    for (auto& rank : ranks_) {
      if (!rank.status) ::waitpid(rank.pid, nullptr, 0);
      for (Stream* stream : {&rank.out, &rank.err}) {
        if (stream->fd >= 0) ::close(stream->fd);
      }
    }
    for (size_t i = 0; i < 3; ++i) ::sigaction(kForwarded[i], &previous_[i], nullptr);
    ::sigaction(SIGPIPE, &previous_[3], nullptr);
    ::close(signal_pipe[0]);
    ::close(signal_pipe[1]);
    signal_pipe[0] = signal_pipe[1] = -1;
    launch_running = false;
  }
  Supervision(const Supervision&) = delete;
  Supervision& operator=(const Supervision&) = delete;

 private:
  static constexpr int kForwarded[3] = {SIGINT, SIGTERM, SIGHUP};
  std::vector<Rank>& ranks_;
  struct sigaction previous_[4] {};
};

}  // namespace

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("vit launch: socket() for a free port failed: " + errno_text());
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const std::string reason = errno_text();
    ::close(fd);
    throw std::runtime_error("vit launch: finding a free TCP port failed: " + reason);
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

std::string own_executable() {
  std::vector<char> path(4096);
  const ssize_t length = ::readlink("/proc/self/exe", path.data(), path.size() - 1);
  if (length <= 0) throw std::runtime_error("vit launch: cannot read /proc/self/exe: " + errno_text());
  return std::string(path.data(), static_cast<size_t>(length));
}

int run_launch(const LaunchRequest& request) {
  check_request(request);
  const int port = request.master_port > 0 ? request.master_port : free_port();
  std::vector<Rank> ranks;
  const Supervision supervision(ranks);

  log::info("launching " + std::to_string(request.nproc) + " ranks on " + request.master_addr + ":" +
            std::to_string(port));
  for (int rank = 0; rank < request.nproc; ++rank) ranks.push_back(start_rank(rank, request, port));

  std::optional<int> failure;  // exit code of the first rank that failed
  std::optional<Clock::time_point> kill_at;
  auto stop_all = [&](int signal) {
    signal_running(ranks, signal);
    if (!kill_at) kill_at = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(request.grace_s * 1000));
  };

  for (;;) {
    std::vector<pollfd> fds{{signal_pipe[0], POLLIN, 0}};
    std::vector<Stream*> streams;
    for (auto& rank : ranks) {
      for (Stream* stream : {&rank.out, &rank.err}) {
        if (stream->fd >= 0) {
          fds.push_back({stream->fd, POLLIN, 0});
          streams.push_back(stream);
        }
      }
    }
    bool all_reaped = true;
    for (const auto& rank : ranks) all_reaped = all_reaped && rank.status.has_value();
    if (all_reaped && streams.empty()) break;

    if (::poll(fds.data(), fds.size(), 100) < 0 && errno != EINTR) {
      throw std::runtime_error("vit launch: poll() failed: " + errno_text());
    }
    if (fds[0].revents & POLLIN) {
      unsigned char number = 0;
      while (::read(signal_pipe[0], &number, 1) == 1) {
        log::warn(std::string("vit launch: ") + strsignal(number) + ", passing it on to the ranks");
        stop_all(number);
      }
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) streams[i - 1]->read_some();
    }

    for (size_t r = 0; r < ranks.size(); ++r) {
      Rank& rank = ranks[r];
      if (rank.status) continue;
      int status = 0;
      if (::waitpid(rank.pid, &status, WNOHANG) != rank.pid) continue;
      rank.status = status;
      // 130: stopped on request (ours, or a signal sent to this rank alone: the ranks stop together at one step).
      // After the first failure, the others' statuses are its consequences.
      const int code = exit_code(status);
      if (code == kSuccess || code == kStopped || failure) continue;
      failure = code;
      int running = 0;
      for (const auto& other : ranks) running += other.status ? 0 : 1;
      log::error("vit launch: rank " + std::to_string(r) + " (pid " + std::to_string(rank.pid) + ") failed: " +
                 describe_status(status) +
                 (running > 0 ? "; stopping the other " + std::to_string(running) + " rank(s)" : ""));
      if (running > 0) stop_all(SIGTERM);
    }

    if (kill_at && Clock::now() >= *kill_at) {
      bool any_running = false;
      for (const auto& rank : ranks) any_running = any_running || !rank.status;
      if (any_running) {
        std::ostringstream grace;
        grace << request.grace_s;
        log::error("vit launch: ranks still running " + grace.str() + " s after being told to stop (--grace); " +
                   "killing them");
        signal_running(ranks, SIGKILL);
      }
      kill_at = Clock::time_point::max();  // kill once
    }
  }

  if (failure) return *failure;
  for (const auto& rank : ranks) {
    if (exit_code(*rank.status) == kStopped) return kStopped;
  }
  return kSuccess;
}

}  // namespace vit
