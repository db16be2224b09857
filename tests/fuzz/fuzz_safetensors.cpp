// libFuzzer target: the safetensors reader (io/safetensors.h) on arbitrary bytes, then every tensor it returns.
// A thrown error is the expected answer to a bad file; a crash, a sanitizer report or a huge allocation is a bug.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto archive = vit::safetensors::parse(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
    for (const auto& info : archive.tensors) {
      // Both conversions: as stored (bool through its byte check) and as float32; sum() reads every element.
      archive.tensor(info, /*as_float32=*/false).sum();
      archive.tensor(info.name).sum();
    }
  } catch (const std::exception&) {  // c10::Error is a std::exception
  }
  return 0;
}
