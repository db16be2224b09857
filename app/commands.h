// The subcommands of `vit`: each file app/cmd_X.cpp registers one with setup_X; main wires them together.
#pragma once

#include <CLI/CLI.hpp>

namespace vit::app {

// Exit statuses, documented in `vit --help`.
enum ExitCode : int {
  kOk = 0,
  kError = 1,          // runtime failure: unreadable or corrupt file, training diverged, ...
  kUsage = 2,          // bad command line or bad config value
  kPartial = 3,        // some inputs failed (their errors are reported), the rest were processed
  kInterrupted = 130,  // stopped by SIGINT/SIGTERM; the last good checkpoint is intact
};

// Each setup registers a subcommand whose callback stores its exit status in `status`.
void setup_info(CLI::App& app, int& status);
void setup_predict(CLI::App& app, int& status);
void setup_embed(CLI::App& app, int& status);
void setup_train(CLI::App& app, int& status);
void setup_evaluate(CLI::App& app, int& status);
void setup_export_attention(CLI::App& app, int& status);
void setup_bench(CLI::App& app, int& status);
void setup_launch(CLI::App& app, int& status);
void setup_export(CLI::App& app, int& status);
void setup_serve(CLI::App& app, int& status);

}  // namespace vit::app
