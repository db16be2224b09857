// `vit launch`'s supervisor: starts N local ranks of a command with torchrun's environment, prefixes each rank's
// output lines with "<rank>: ", passes SIGINT/SIGTERM/SIGHUP on, and stops the others when one rank fails.
// POSIX only (fork, pipes, poll); no torch.
#pragma once

#include <unistd.h>

#include <string>
#include <vector>

namespace vit {

struct LaunchRequest {
  int nproc = 0;                          // ranks (processes) to start, 1..1024
  std::string master_addr = "127.0.0.1";  // MASTER_ADDR given to every rank
  int master_port = 0;                    // MASTER_PORT, 0..65535; 0: a free port (free_port())
  double grace_s = 30.0;                  // seconds ranks get between SIGTERM and SIGKILL when they are stopped
  std::vector<std::string> argv;          // what each rank runs: a program path (no PATH search), then arguments
  int stdout_fd = STDOUT_FILENO;          // where the ranks' stdout lines go, prefixed "<rank>: "
  int stderr_fd = STDERR_FILENO;          // where their stderr lines go, prefixed the same way
};

// Runs the ranks until all have ended. Each rank gets the caller's environment plus RANK and LOCAL_RANK (its index),
// WORLD_SIZE and LOCAL_WORLD_SIZE (nproc), GROUP_RANK=0, MASTER_ADDR and MASTER_PORT; it gets SIGTERM when the
// supervisor dies. While running, SIGINT/SIGTERM/SIGHUP sent to this process are passed on to every rank, and
// SIGPIPE is ignored; the previous handlers are restored on return. One call at a time per process.
// When a rank fails (an exit status other than 0 and 130, or killed by a signal), the others get SIGTERM; ranks
// still running grace_s after being told to stop get SIGKILL.
// Returns the exit status for the whole launch: the first failed rank's (its exit status, or 128 + the signal that
// killed it); otherwise 130 when some rank stopped on request (exit status 130); otherwise 0.
// Throws std::invalid_argument for a bad request, std::runtime_error when a pipe, fork or poll fails.
int run_launch(const LaunchRequest& request);

// A TCP port nobody listens on right now: binds port 0, reads what the kernel chose, closes. Another process could
// take it before it is bound again; the window is milliseconds. Throws std::runtime_error naming the failing call.
int free_port();

// This process's executable (/proc/self/exe), for ranks that run the same program.
std::string own_executable();

}  // namespace vit
