// Logging to stderr (stdout carries command output such as JSON): spdlog where the build has it, else a plain
// fallback that prints the same line format.
#include "util/log.h"

#include <mutex>

#include "util/text.h"
#include "vit/build_config.h"

#if spdlog_FOUND
#include <spdlog/sinks/stdout_color_sinks.h>  // declares stderr_color_mt too
#include <spdlog/spdlog.h>
#else
#include <atomic>
#include <cstdio>
#include <ctime>
#endif

namespace vit::log {
namespace {

// Guards the prefix: data-loader threads log while the main thread may still be configuring.
std::mutex prefix_mutex;
std::string prefix;

// Messages quote file names and file content: escaped, so a hostile name cannot drive the terminal, and one
// message stays one line.
std::string with_prefix(const std::string& message) {
  std::lock_guard<std::mutex> lock(prefix_mutex);
  return prefix + printable(message);
}

#if spdlog_FOUND

// A logger of our own rather than spdlog's default one, so a library linked in that reconfigures the default
// logger cannot redirect ours to stdout.
spdlog::logger& logger() {
  static const std::shared_ptr<spdlog::logger> instance = [] {
    auto created = spdlog::stderr_color_mt("vit");
    created->set_pattern("[%H:%M:%S] [%l] %v");
    created->set_level(spdlog::level::info);
    return created;
  }();
  return *instance;
}

spdlog::level::level_enum to_spdlog(Level level) {
  switch (level) {
    case Level::debug: return spdlog::level::debug;
    case Level::info: return spdlog::level::info;
    case Level::warn: return spdlog::level::warn;
    case Level::error: return spdlog::level::err;
  }
  return spdlog::level::info;
}

void emit(Level level, const std::string& message) { logger().log(to_spdlog(level), with_prefix(message)); }

#else

std::atomic<Level> threshold{Level::info};
std::mutex output_mutex;

const char* level_name(Level level) {
  switch (level) {
    case Level::debug: return "debug";
    case Level::info: return "info";
    case Level::warn: return "warning";
    case Level::error: return "error";
  }
  return "info";
}

void emit(Level level, const std::string& message) {
  if (static_cast<int>(level) < static_cast<int>(threshold.load())) return;
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char clock[16];
  std::strftime(clock, sizeof clock, "%H:%M:%S", &local);
  const std::string line = std::string("[") + clock + "] [" + level_name(level) + "] " + with_prefix(message) + "\n";
  // One write per line under a lock, so lines from several threads never interleave mid-line.
  std::lock_guard<std::mutex> lock(output_mutex);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

#endif

}  // namespace

void set_level(Level level) {
#if spdlog_FOUND
  logger().set_level(to_spdlog(level));
#else
  threshold.store(level);
#endif
}

void set_prefix(const std::string& new_prefix) {
  std::lock_guard<std::mutex> lock(prefix_mutex);
  prefix = new_prefix;
}

void debug(const std::string& message) { emit(Level::debug, message); }
void info(const std::string& message) { emit(Level::info, message); }
void warn(const std::string& message) { emit(Level::warn, message); }
void error(const std::string& message) { emit(Level::error, message); }

}  // namespace vit::log
