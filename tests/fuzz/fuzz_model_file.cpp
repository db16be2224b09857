// libFuzzer target: model files (io/model_file.h): load_model on arbitrary bytes written to /dev/shm, alone (the
// metadata describes the model) and with a tiny --config (a plain timm file), then what `vit info` shows of it.
// A hostile file must fail with a clear error before any allocation its metadata asks for.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "io/model_file.h"
#include "model/flops.h"
#include "scratch.h"

namespace {

std::string model_path() { return vit::fuzz::scratch_dir() + "/model.safetensors"; }

// The architecture of the plain seed files (scripts/make_fuzz_corpus.py writes the same).
const vit::Config& tiny_config() {
  static const vit::Config config = vit::parse_config(
      nlohmann::json::parse(R"({"model": {"img_size": 8, "patch_size": 4, "in_chans": 1, "num_classes": 2,
                                          "embed_dim": 8, "depth": 1, "num_heads": 2, "mlp_ratio": 2.0},
                                "data": {"mean": [0.5], "std": [0.5]}})"),
      "fuzz_model_file");
  return config;
}

void load(const std::optional<vit::Config>& fallback) {
  try {
    const vit::LoadedModel model = vit::load_model(model_path(), fallback);
    vit::count_parameters(*model.net);
    vit::forward_macs(model.config());
    vit::layer_costs(model.config());
  } catch (const std::exception&) {  // c10::Error is a std::exception
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::ofstream(model_path(), std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), size);
  load(std::nullopt);
  load(tiny_config());
  return 0;
}
