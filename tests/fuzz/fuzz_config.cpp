// libFuzzer target: the config reader (config/config.h), load_config with `--set` overrides, on arbitrary text.
// Input: the bytes before the first NUL are the JSON config file; after it, one override assignment per line.
// A config that parses must parse again from its own to_json (the round trip `vit train` relies on for run dirs).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "scratch.h"

namespace {

std::string config_path() { return vit::fuzz::scratch_dir() + "/config.json"; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  std::vector<std::string> overrides;
  if (nul != std::string::npos) {
    size_t start = nul + 1;
    while (start <= input.size()) {
      size_t end = input.find('\n', start);
      if (end == std::string::npos) end = input.size();
      overrides.push_back(input.substr(start, end - start));
      start = end + 1;
    }
  }
  std::ofstream(config_path(), std::ios::binary | std::ios::trunc) << input.substr(0, nul);

  vit::Config config;
  try {
    config = vit::load_config(config_path(), overrides);
  } catch (const std::exception&) {
    return 0;  // a clear error is the answer to a bad config
  }
  // No try here: a config we accepted and wrote back must be accepted again, unchanged.
  const nlohmann::json written = vit::to_json(config);
  written.dump();  // what a run directory's config.json holds: throws on a string that is not UTF-8
  const vit::Config again = vit::parse_config(written, "round trip");
  if (vit::to_json(again) != written) std::abort();
  return 0;
}
