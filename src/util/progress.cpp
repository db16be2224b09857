// Progress on stderr: a bar on a terminal, periodic log lines elsewhere.
#include "util/progress.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

#include "util/log.h"

namespace vit {
namespace {

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// $VIT_PROGRESS_INTERVAL when it is a number >= 0 (tests set 0: a line per advance), else 10 s.
double default_log_seconds() {
  const char* text = std::getenv("VIT_PROGRESS_INTERVAL");
  if (text == nullptr || *text == '\0') return 10.0;
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  if (*end != '\0' || !(value >= 0.0)) {
    log::warn(std::string("VIT_PROGRESS_INTERVAL=") + text + " is not a number of seconds >= 0: using 10");
    return 10.0;
  }
  return value;
}

// Few digits, as a rate is read: 1234 img/s, 85.3 img/s, 2.41 img/s.
std::string rate_text(int64_t done, double elapsed_seconds, const std::string& unit) {
  char text[64];
  if (elapsed_seconds <= 0.0) {
    std::snprintf(text, sizeof text, "- %s/s", unit.c_str());
    return text;
  }
  const double rate = static_cast<double>(done) / elapsed_seconds;
  const char* format = rate >= 100.0 ? "%.0f %s/s" : rate >= 10.0 ? "%.1f %s/s" : "%.2f %s/s";
  std::snprintf(text, sizeof text, format, rate, unit.c_str());
  return text;
}

// Remaining time at the average rate so far; unknown (negative) before anything is done.
double eta_seconds(int64_t done, int64_t total, double elapsed_seconds) {
  if (done <= 0 || elapsed_seconds <= 0.0) return -1.0;
  return static_cast<double>(std::max<int64_t>(total - done, 0)) * elapsed_seconds / static_cast<double>(done);
}

}  // namespace

std::string format_duration(double seconds) {
  if (!(seconds >= 0.0) || !std::isfinite(seconds)) return "-:--";
  const auto whole = static_cast<long long>(std::llround(seconds));
  const long long hours = whole / 3600, minutes = whole / 60 % 60, rest = whole % 60;
  char text[32];
  if (hours > 0) {
    std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", hours, minutes, rest);
  } else {
    std::snprintf(text, sizeof text, "%lld:%02lld", minutes, rest);
  }
  return text;
}

std::string progress_bar_text(const std::string& label, const std::string& unit, int64_t done, int64_t total,
                              double elapsed_seconds, bool finished, int width) {
  const int64_t filled = total > 0 ? std::clamp<int64_t>(done * width / total, 0, width) : width;
  std::string bar(static_cast<size_t>(width), ' ');
  std::fill_n(bar.begin(), filled, '=');
  if (filled < width) bar[static_cast<size_t>(filled)] = '>';
  std::string text = label;
  text += " [";
  text += bar;
  text += "] ";
  text += std::to_string(done);
  text += '/';
  text += std::to_string(total);
  text += ' ';
  text += rate_text(done, elapsed_seconds, unit);
  text += finished ? " in " : " ETA ";
  text += format_duration(finished ? elapsed_seconds : eta_seconds(done, total, elapsed_seconds));
  return text;
}

std::string progress_log_text(const std::string& label, const std::string& unit, int64_t done, int64_t total,
                              double elapsed_seconds, bool finished) {
  std::string text = label;
  text += ": ";
  text += std::to_string(done);
  text += '/';
  text += std::to_string(total);
  if (finished) {
    text += " in ";
    text += format_duration(elapsed_seconds);
    text += ", ";
    text += rate_text(done, elapsed_seconds, unit);
    return text;
  }
  const int64_t percent = total > 0 ? done * 100 / total : 100;
  text += " (";
  text += std::to_string(percent);
  text += "%), ";
  text += rate_text(done, elapsed_seconds, unit);
  text += ", ETA ";
  text += format_duration(eta_seconds(done, total, elapsed_seconds));
  return text;
}

Progress::Progress(int64_t total, std::string label, std::string unit, ProgressOptions options)
    : total_(total), label_(std::move(label)), unit_(std::move(unit)), options_(std::move(options)) {
  if (total_ < 0) {
    std::string message = "progress: total ";
    message += std::to_string(total_);
    throw std::invalid_argument(message + " is negative");
  }
  terminal_ = options_.terminal.value_or(::isatty(STDERR_FILENO) == 1);
  log_seconds_ = options_.log_seconds.value_or(default_log_seconds());
  if (!options_.log_line) options_.log_line = [](const std::string& line) { log::info(line); };
  start_ = now();
  last_output_ = start_;
}

Progress::~Progress() {
  try {
    finish();
  } catch (...) {
    // A destructor must not throw; a failed last line is not worth losing the run for.
  }
}

double Progress::now() const { return options_.clock ? options_.clock() : steady_seconds(); }

int64_t Progress::done() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

void Progress::advance(int64_t count) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (finished_) return;
  done_ += count;
  if (!options_.show) return;
  const double t = now();
  if (terminal_) {
    // The first state at once, then at most every redraw_seconds; the last one is finish()'s.
    if (drawn_ && !cleared_ && t - last_output_ < options_.redraw_seconds) return;
  } else if (t - last_output_ < log_seconds_) {
    return;
  }
  last_output_ = t;
  draw(/*finished=*/false);
}

void Progress::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!options_.show || !terminal_ || !drawn_ || cleared_ || finished_) return;
  std::fputs("\r\033[K", options_.bar_out);
  std::fflush(options_.bar_out);
  cleared_ = true;
}

void Progress::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (finished_) return;
  finished_ = true;
  // A bar that was never drawn, or a run too short for a log line, ends as quietly as it ran.
  if (!options_.show || !drawn_) return;
  draw(/*finished=*/true);
}

void Progress::draw(bool finished) {
  const double elapsed = now() - start_;
  if (terminal_) {
    std::string line = "\r\033[K";  // appended: GCC 12 warns falsely on "literal" + std::string&&
    line += progress_bar_text(label_, unit_, done_, total_, elapsed, finished);
    if (finished) line += '\n';
    std::fputs(line.c_str(), options_.bar_out);
    std::fflush(options_.bar_out);
  } else {
    options_.log_line(progress_log_text(label_, unit_, done_, total_, elapsed, finished));
  }
  drawn_ = true;
  cleared_ = false;
}

}  // namespace vit
