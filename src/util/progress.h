// Progress of long work over a known number of items (images, samples) on stderr: a redrawn bar with the rate and ETA
// on a terminal, a periodic log line otherwise, so stdout stays data only. No LibTorch.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

namespace vit {

struct ProgressOptions {
  bool show = true;                 // false: report nothing (a short run stays quiet)
  std::optional<bool> terminal;     // bar (true) or log lines (false); unset: whether stderr is a terminal
  std::FILE* bar_out = stderr;      // where the bar is drawn
  double redraw_seconds = 0.1;      // the bar is redrawn at most this often
  std::optional<double> log_seconds;  // between log lines; unset: $VIT_PROGRESS_INTERVAL, else 10
  std::function<void(const std::string&)> log_line;  // receives each log line; unset: log::info
  std::function<double()> clock;    // seconds since any fixed point; unset: a steady clock (tests inject their own)
};

// "0:04", "12:30", "1:02:03": a duration as the bar and the log lines write it; "-:--" when unknown (negative, NaN).
std::string format_duration(double seconds);

// One state of the bar, without the leading "\r\033[K": "<label> [=====>    ] 120/500 85.3 img/s ETA 0:04". The rate
// is done / elapsed, the ETA (total - done) / rate; with finished, "in <elapsed>" replaces the ETA.
std::string progress_bar_text(const std::string& label, const std::string& unit, int64_t done, int64_t total,
                              double elapsed_seconds, bool finished, int width = 30);
// The log line of one state: "<label>: 120/500 (24%), 85.3 img/s, ETA 0:04"; finished: "<label>: 500/500 in 0:06,
// 85.3 img/s".
std::string progress_log_text(const std::string& label, const std::string& unit, int64_t done, int64_t total,
                              double elapsed_seconds, bool finished);

// Counts work done out of `total`. On a terminal, redraws one line ("\r\033[K" + progress_bar_text) at most every
// redraw_seconds; elsewhere logs progress_log_text every log_seconds, so a run shorter than that logs nothing, and a
// run that logged also logs its end. advance() may be called from several threads.
class Progress {
 public:
  Progress(int64_t total, std::string label, std::string unit = "img", ProgressOptions options = {});
  ~Progress();  // finish()
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void advance(int64_t count = 1);
  // Erases the bar so that other output (a log line, a result on a stdout that shares the terminal) can take its
  // line; the next advance() draws it again. Nothing in log mode.
  void clear();
  // Ends the report: the bar drawn a last time with a newline, or the closing log line. Idempotent.
  void finish();

  int64_t done() const;

 private:
  double now() const;
  void draw(bool finished);  // with mutex_ held

  const int64_t total_;
  const std::string label_, unit_;
  ProgressOptions options_;
  bool terminal_ = false;
  double log_seconds_ = 10.0;
  double start_ = 0.0;
  double last_output_ = 0.0;  // when the bar was drawn or the last line logged
  bool drawn_ = false;        // the bar is on screen (terminal), or a line was logged (log mode)
  bool cleared_ = false;      // clear() erased it: the next advance redraws at once
  bool finished_ = false;
  int64_t done_ = 0;
  mutable std::mutex mutex_;
};

}  // namespace vit
