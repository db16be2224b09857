// `vit`: the command-line entry point. Only this file decides exit codes: every error is caught here, logged once.
#include <c10/util/Exception.h>

#include <csignal>
#include <iostream>

#include "commands.h"
#include "util/log.h"
#include "util/runtime.h"
#include "vit/build_config.h"

int main(int argc, char** argv) {
  using namespace vit::app;
  vit::configure_allocator();
  // Past a file-size limit (ulimit -f) a write then fails with EFBIG, reported like a full disk, instead of the
  // default SIGXFSZ killing the process mid-checkpoint.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"vit " VIT_VERSION
               ": train, evaluate and inspect Vision Transformers.\n\n"
               "Exit status: 0 success; 1 runtime error (unreadable or corrupt file, diverged training, ...); "
               "2 bad command line or config; 3 some inputs failed, the rest were processed (1 when all failed); "
               "130 interrupted (checkpoints intact)."};
  app.require_subcommand(1);
  app.set_version_flag("--version", VIT_VERSION);
  int status = kOk;
  setup_train(app, status);
  setup_evaluate(app, status);
  setup_predict(app, status);
  setup_embed(app, status);
  setup_export_attention(app, status);
  setup_export(app, status);
  setup_info(app, status);
  setup_bench(app, status);
  setup_launch(app, status);
  setup_serve(app, status);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kOk : kUsage;  // prints --help, or the usage error
  } catch (const std::invalid_argument& e) {
    vit::log::error(e.what());
    return kUsage;
  } catch (const c10::Error& e) {
    vit::log::error(e.what_without_backtrace());
    return kError;
  } catch (const std::exception& e) {
    vit::log::error(e.what());
    return kError;
  }
  return status;
}
