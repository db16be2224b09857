// `vit launch`: runs N local ranks of a vit command with torchrun's environment (src/launch/launch.h).
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "launch/launch.h"

namespace vit::app {

void setup_launch(CLI::App& app, int& status) {
  auto request = std::make_shared<LaunchRequest>();
  auto command = std::make_shared<std::vector<std::string>>();
  auto* launch = app.add_subcommand(
      "launch", "Run N ranks of a vit command on this machine (torchrun's environment; see README for multi-node)");
  launch->add_option("--nproc", request->nproc, "ranks (processes) to start")->required()->check(CLI::Range(1, 1024));
  launch->add_option("--master-addr", request->master_addr, "MASTER_ADDR given to the ranks")->capture_default_str();
  launch->add_option("--master-port", request->master_port, "MASTER_PORT (default: a free port)")
      ->check(CLI::Range(0, 65535));
  launch->add_option("--grace", request->grace_s, "seconds ranks get to stop before SIGKILL")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
  // After --, options like --config belong to the ranks' command, not to launch.
  launch->add_option("command", *command, "the vit command each rank runs, after --")->required();
  launch->footer("Example: vit launch --nproc 2 -- train --config configs/fashion_mnist.json --set train.threads=1");
  launch->callback([request, command, &status] {
    request->argv = {own_executable()};
    request->argv.insert(request->argv.end(), command->begin(), command->end());
    status = run_launch(*request);
  });
}

}  // namespace vit::app
