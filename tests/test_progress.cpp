// The progress report (util/progress.h) without a terminal: the bar's text and ETA arithmetic, redraw throttling and
// clearing on a "terminal" that is a temp file, the log lines' cadence (none for a short run), and thread safety.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

#include "test_util.h"
#include "util/fs.h"
#include "util/progress.h"

namespace vit {
namespace {

// A clock the test moves by hand.
struct FakeClock {
  double seconds = 100.0;
  std::function<double()> function() {
    return [this] { return seconds; };
  }
};

TEST(Progress, DurationsAsMinutesSecondsAndHours) {
  EXPECT_EQ(format_duration(0), "0:00");
  EXPECT_EQ(format_duration(4.4), "0:04");
  EXPECT_EQ(format_duration(59.6), "1:00");
  EXPECT_EQ(format_duration(750), "12:30");
  EXPECT_EQ(format_duration(3723), "1:02:03");
  EXPECT_EQ(format_duration(-1), "-:--");
  EXPECT_EQ(format_duration(std::nan("")), "-:--");
}

TEST(Progress, BarTextRateAndEta) {
  // 120 of 500 in 1.406 s: 85.3 img/s, the other 380 in 4.45 s.
  EXPECT_EQ(progress_bar_text("predict", "img", 120, 500, 120 / 85.3, false, 20),
            "predict [====>               ] 120/500 85.3 img/s ETA 0:04");
  // Rates keep three digits or so; the ETA is (total - done) / rate.
  EXPECT_EQ(progress_bar_text("embed", "img", 50, 100, 20.0, false, 10),
            "embed [=====>    ] 50/100 2.50 img/s ETA 0:20");
  EXPECT_EQ(progress_bar_text("embed", "img", 3000, 9000, 2.0, false, 10),
            "embed [===>      ] 3000/9000 1500 img/s ETA 0:04");
  // Nothing done yet: no rate, no ETA.
  EXPECT_EQ(progress_bar_text("x", "img", 0, 10, 0.0, false, 4), "x [>   ] 0/10 - img/s ETA -:--");
  // Finished: a full bar and the time taken.
  EXPECT_EQ(progress_bar_text("x", "img", 10, 10, 65.0, true, 4), "x [====] 10/10 0.15 img/s in 1:05");
}

TEST(Progress, LogTextWithPercentAndEta) {
  EXPECT_EQ(progress_log_text("evaluate", "img", 120, 500, 12.0, false),
            "evaluate: 120/500 (24%), 10.0 img/s, ETA 0:38");
  EXPECT_EQ(progress_log_text("evaluate", "img", 500, 500, 50.0, true), "evaluate: 500/500 in 0:50, 10.0 img/s");
}

// The "terminal" is a temp file: what a user's terminal would receive, byte for byte.
std::string terminal_run(const std::function<void(Progress&, FakeClock&)>& body, int64_t total) {
  test::TempDir dir;
  const std::string path = dir.file("tty");
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) throw std::runtime_error("cannot open " + path);
  FakeClock clock;
  {
    ProgressOptions options;
    options.terminal = true;
    options.bar_out = file;
    options.clock = clock.function();
    Progress progress(total, "p", "img", options);
    body(progress, clock);
  }  // the destructor finishes
  std::fclose(file);
  return read_file(path);
}

TEST(Progress, TerminalRedrawsOneLineAtMostTenTimesASecondAndEndsIt) {
  const std::string screen = terminal_run(
      [](Progress& progress, FakeClock& clock) {
        progress.advance(1);   // drawn at once
        clock.seconds += 0.05;
        progress.advance(1);   // too soon: not drawn
        clock.seconds += 0.1;
        progress.advance(2);   // drawn
      },
      8);
  const std::string erase = "\r\033[K";
  EXPECT_EQ(screen, erase + "p [===>                          ] 1/8 - img/s ETA -:--" +  // the clock had not moved
                        erase + "p [===============>              ] 4/8 26.7 img/s ETA 0:00" + erase +
                        "p [===============>              ] 4/8 26.7 img/s in 0:00\n");
}

TEST(Progress, ClearErasesTheBarAndTheNextAdvanceRedrawsIt) {
  const std::string screen = terminal_run(
      [](Progress& progress, FakeClock& clock) {
        clock.seconds += 1.0;
        progress.advance(1);
        progress.clear();
        progress.clear();      // already clear: nothing more
        progress.advance(1);   // within 0.1 s, but the bar is gone: redrawn
        progress.finish();
        progress.finish();     // idempotent
        progress.advance(1);   // after the end: nothing
      },
      2);
  EXPECT_EQ(screen, "\r\033[Kp [===============>              ] 1/2 1.00 img/s ETA 0:01\r\033[K"
                    "\r\033[Kp [==============================] 2/2 2.00 img/s ETA 0:00"
                    "\r\033[Kp [==============================] 2/2 2.00 img/s in 0:01\n");
}

TEST(Progress, HiddenOrNeverAdvancedPrintsNothing) {
  EXPECT_EQ(terminal_run([](Progress&, FakeClock&) {}, 5), "");
  test::TempDir dir;
  std::FILE* file = std::fopen(dir.file("tty").c_str(), "w");
  ASSERT_NE(file, nullptr);
  {
    ProgressOptions options;
    options.show = false;
    options.terminal = true;
    options.bar_out = file;
    Progress progress(5, "p", "img", options);
    progress.advance(5);
    EXPECT_EQ(progress.done(), 5);  // counted, not shown
  }
  std::fclose(file);
  EXPECT_EQ(read_file(dir.file("tty")), "");
}

TEST(Progress, LogLinesEveryIntervalNoneForAShortRun) {
  FakeClock clock;
  std::vector<std::string> lines;
  ProgressOptions options;
  options.terminal = false;
  options.log_seconds = 10.0;
  options.clock = clock.function();
  options.log_line = [&](const std::string& line) { lines.push_back(line); };
  {
    Progress quick(100, "predict", "img", options);
    clock.seconds += 9.0;
    quick.advance(100);
  }
  EXPECT_TRUE(lines.empty()) << lines.front();

  Progress slow(100, "predict", "img", options);
  for (int i = 0; i < 25; ++i) {
    clock.seconds += 1.0;
    slow.advance(2);
  }
  slow.finish();
  EXPECT_EQ(lines, (std::vector<std::string>{"predict: 20/100 (20%), 2.00 img/s, ETA 0:40",
                                             "predict: 40/100 (40%), 2.00 img/s, ETA 0:30",
                                             "predict: 50/100 in 0:25, 2.00 img/s"}));
}

TEST(Progress, AdvanceFromSeveralThreadsCountsEverything) {
  ProgressOptions options;
  options.terminal = false;
  options.log_seconds = 0.0;  // a line per advance: the line sink is exercised concurrently too
  std::atomic<int> lines{0};
  options.log_line = [&](const std::string&) { ++lines; };
  Progress progress(4000, "p", "img", options);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) progress.advance();
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(progress.done(), 4000);
  progress.finish();
  EXPECT_EQ(lines.load(), 4001);
  EXPECT_THROW(Progress(-1, "p"), std::invalid_argument);
}

}  // namespace
}  // namespace vit
