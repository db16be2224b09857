// `vit launch`'s supervisor (src/launch/) called directly, with `/bin/sh -c` scripts as ranks: line prefixes, the
// torchrun environment, a failing rank stopping the others, signals passed on, the grace period; then the CLI wiring.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <thread>

#include "launch/launch.h"
#include "test_util.h"
#include "util/fs.h"
#include "vit/build_config.h"

namespace vit {
namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// One launch of `script` (run by /bin/sh in every rank, with $DIR the temp folder), its output in files there.
struct ShellLaunch {
  test::TempDir dir;
  LaunchRequest request;
  std::string out, err;  // the ranks' prefixed lines, after run()
  double seconds = 0;    // how long run() took

  ShellLaunch(int nproc, const std::string& script) {
    request.nproc = nproc;
    request.argv = {"/bin/sh", "-c", "DIR='" + dir.path() + "'; " + script};
  }
  int run() {
    const int out_fd = ::open(dir.file("out").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const int err_fd = ::open(dir.file("err").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out_fd < 0 || err_fd < 0) throw std::runtime_error("cannot open the output files in " + dir.path());
    request.stdout_fd = out_fd;
    request.stderr_fd = err_fd;
    const auto start = Clock::now();
    int status = -1;
    try {
      status = run_launch(request);
    } catch (...) {
      ::close(out_fd), ::close(err_fd);
      throw;
    }
    seconds = std::chrono::duration<double>(Clock::now() - start).count();
    ::close(out_fd), ::close(err_fd);
    out = read_file(dir.file("out"));
    err = read_file(dir.file("err"));
    return status;
  }
};

// Ranks that say "stopped" and exit 130 on SIGTERM, after writing $DIR/ready-$RANK (the trap is set by then).
const std::string kStoppable =
    "trap 'echo stopped; exit 130' TERM; touch \"$DIR/ready-$RANK\"; while :; do sleep 0.05; done";

bool wait_for_files(const std::vector<std::string>& paths, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  for (const auto& path : paths) {
    while (!fs::exists(path)) {
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  return true;
}

TEST(Launch, PrefixesEachRanksLinesAndSetsTheTorchrunEnvironment) {
  ::setenv("RANK", "99", /*overwrite=*/1);        // replaced in the ranks, not duplicated
  ::setenv("VIT_TEST_INHERITED", "yes", /*overwrite=*/1);  // the rest of the environment is passed on
  ShellLaunch launch(3,
                     "echo \"env $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR "
                     "$MASTER_PORT $VIT_TEST_INHERITED\"; echo \"err $RANK\" >&2; printf 'no newline'; "
                     "env | grep -c '^RANK='");
  launch.request.master_addr = "127.0.0.2";
  launch.request.master_port = 29123;
  const int status = launch.run();
  ::unsetenv("RANK");
  ::unsetenv("VIT_TEST_INHERITED");
  ASSERT_EQ(status, 0) << launch.err;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string r = std::to_string(rank);
    EXPECT_NE(launch.out.find(r + ": env " + r + " " + r + " 3 3 0 127.0.0.2 29123 yes\n"), std::string::npos)
        << launch.out;
    EXPECT_NE(launch.out.find(r + ": no newline1\n"), std::string::npos) << launch.out;  // one RANK= each
    EXPECT_NE(launch.err.find(r + ": err " + r + "\n"), std::string::npos) << launch.err;
  }
  std::istringstream lines(launch.out);
  for (std::string line; std::getline(lines, line);) {
    EXPECT_TRUE(line.size() > 3 && line[1] == ':' && line[2] == ' ') << "unprefixed line: " << line;
  }
}

TEST(Launch, PortZeroPicksAFreePort) {
  ShellLaunch launch(2, "echo \"port $MASTER_PORT\"");
  ASSERT_EQ(launch.run(), 0) << launch.err;
  const auto at = launch.out.find("0: port ");
  ASSERT_NE(at, std::string::npos) << launch.out;
  const int port = std::stoi(launch.out.substr(at + 8));
  EXPECT_GT(port, 0);
  EXPECT_LT(port, 65536);
  EXPECT_NE(launch.out.find("1: port " + std::to_string(port) + "\n"), std::string::npos) << launch.out;

  const int free = free_port();
  EXPECT_GT(free, 0);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(free));
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0) << "port " << free << " is taken";
  ::close(fd);
}

TEST(Launch, StatusOfAKilledRankAndOfAProgramThatCannotRun) {
  ShellLaunch killed(1, "kill -9 $$");
  EXPECT_EQ(killed.run(), 128 + SIGKILL);

  ShellLaunch missing(2, "");
  missing.request.argv = {missing.dir.file("no-such-program")};
  EXPECT_EQ(missing.run(), 127);
  EXPECT_NE(missing.err.find("0: vit launch: cannot execute " + missing.dir.file("no-such-program") + "\n"),
            std::string::npos)
      << missing.err;

  ShellLaunch stopped(2, "exit 130");  // stopped on request, nothing failed
  EXPECT_EQ(stopped.run(), 130);
}

TEST(Launch, BadRequestsThrowNamingTheValue) {
  LaunchRequest request;
  request.argv = {"/bin/true"};
  request.nproc = 0;
  EXPECT_NE(test::error_of([&] { run_launch(request); }).find("nproc 0 is outside [1, 1024]"), std::string::npos);
  EXPECT_THROW(run_launch(request), std::invalid_argument);
  request.nproc = 1;
  request.master_port = 70000;
  EXPECT_NE(test::error_of([&] { run_launch(request); }).find("master_port 70000"), std::string::npos);
  request.master_port = 0;
  request.grace_s = -1;
  EXPECT_NE(test::error_of([&] { run_launch(request); }).find("grace -1 s"), std::string::npos);
  request.grace_s = 1;
  request.argv.clear();
  EXPECT_NE(test::error_of([&] { run_launch(request); }).find("no command"), std::string::npos);
  EXPECT_THROW(run_launch(request), std::invalid_argument);
}

TEST(LaunchSignals, DeadRankStopsTheOthersAndFailsTheLaunch) {
  // Rank 1 fails once ranks 0 and 2 are ready; they are told to stop and do.
  ShellLaunch launch(3, "if [ \"$RANK\" = 1 ]; then while [ ! -e \"$DIR/ready-0\" ] || [ ! -e \"$DIR/ready-2\" ]; "
                        "do sleep 0.02; done; echo failing; exit 7; fi; " + kStoppable);
  launch.request.grace_s = 30;
  EXPECT_EQ(launch.run(), 7) << launch.err;
  EXPECT_LT(launch.seconds, 20.0) << "the other ranks were not stopped";
  EXPECT_NE(launch.out.find("1: failing\n"), std::string::npos) << launch.out;
  EXPECT_NE(launch.out.find("0: stopped\n"), std::string::npos) << launch.out;
  EXPECT_NE(launch.out.find("2: stopped\n"), std::string::npos) << launch.out;
}

TEST(LaunchSignals, SigtermToTheLauncherStopsEveryRankCleanly) {
  ShellLaunch launch(2, kStoppable);
  std::thread sender([&] {
    if (wait_for_files({launch.dir.file("ready-0"), launch.dir.file("ready-1")}, 60)) ::kill(::getpid(), SIGTERM);
  });
  const int status = launch.run();
  sender.join();
  EXPECT_EQ(status, 130) << launch.err;
  EXPECT_NE(launch.out.find("0: stopped\n"), std::string::npos) << launch.out;
  EXPECT_NE(launch.out.find("1: stopped\n"), std::string::npos) << launch.out;
  // The handlers of this process are its own again.
  struct sigaction now {};
  ::sigaction(SIGTERM, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_DFL);
}

TEST(LaunchSignals, RanksThatDoNotStopAreKilledAfterTheGracePeriod) {
  // Rank 0 ignores SIGTERM; rank 1 fails once rank 0 is ready.
  ShellLaunch launch(2, "if [ \"$RANK\" = 1 ]; then while [ ! -e \"$DIR/ready-0\" ]; do sleep 0.02; done; exit 3; "
                        "fi; trap '' TERM; touch \"$DIR/ready-0\"; while :; do sleep 0.05; done");
  launch.request.grace_s = 0.5;
  EXPECT_EQ(launch.run(), 3) << launch.err;
  EXPECT_GE(launch.seconds, 0.5);
  EXPECT_LT(launch.seconds, 15.0) << "rank 0 was not killed after the grace period";
}

// ---- the CLI wiring: `vit launch` runs the vit binary itself, and bad command lines are usage errors ----

TEST(LaunchCli, PrefixesEachRanksLinesAndSetsTheEnvironment) {
  const auto launch = test::run_vit("launch --nproc 3 -- --version");
  ASSERT_EQ(launch.status, 0) << launch.errors;
  for (const char* prefix : {"0: ", "1: ", "2: "}) {
    EXPECT_NE(launch.output.find(std::string(prefix) + VIT_VERSION + "\n"), std::string::npos) << launch.output;
  }
  EXPECT_NE(launch.errors.find("launching 3 ranks on 127.0.0.1:"), std::string::npos) << launch.errors;

  test::TempDir dir;
  const auto usage = test::run_vit("launch --nproc 2 -- train --config '" + dir.file("missing.json") + "'");
  EXPECT_EQ(usage.status, 2) << usage.errors;
  EXPECT_NE(usage.errors.find(") failed: exit status 2"), std::string::npos) << usage.errors;

  EXPECT_EQ(test::run_vit("launch --nproc 2").status, 2);
  EXPECT_EQ(test::run_vit("launch --nproc 0 -- --version").status, 2);
}

}  // namespace
}  // namespace vit
