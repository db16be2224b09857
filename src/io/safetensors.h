// Safetensors reader/writer (the format timm and Hugging Face publish weights in), validated up front so that a
// damaged or hostile file fails with one line naming the file and the values, never a crash or a silent misread.
//
// Layout: u64 little-endian header length N, N bytes of JSON (may end in padding spaces), then the data section.
// Header: {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}}
// with offsets relative to the start of the data section.
#pragma once

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace vit::safetensors {

enum class DType { F32, F16, BF16, F64, I64, I32, U8, BOOL };

// "F32", "BF16", ...: the spelling used in the header.
const char* dtype_name(DType dtype);
// Bytes per element.
size_t itemsize(DType dtype);
torch::ScalarType to_scalar_type(DType dtype);

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range within the data section
};

// A parsed and validated file; the data stays in memory until tensors are copied out.
struct Archive {
  std::string path;                             // for error messages
  std::map<std::string, std::string> metadata;  // "__metadata__", empty when absent
  std::vector<TensorInfo> tensors;              // in header order
  std::string bytes;                            // the whole file
  uint64_t data_start = 0;                      // offset of the data section within `bytes`

  // nullptr when absent.
  const TensorInfo* find(const std::string& name) const;
  // A new tensor owning a copy of the data. With as_float32, floating-point tensors (F16, BF16, F64) come back
  // as float32; integer and bool tensors keep their dtype either way.
  torch::Tensor tensor(const TensorInfo& info, bool as_float32 = true) const;
  // Same, by name; throws "<path>: no tensor named '<name>'" when absent.
  torch::Tensor tensor(const std::string& name, bool as_float32 = true) const;
};

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Reads and validates a whole file; throws std::runtime_error "<path>: <what is wrong, with the values>".
Archive read(const std::string& path);
// Same, from bytes already in memory; path_for_errors is what the messages name.
Archive parse(std::string bytes, const std::string& path_for_errors);

// The bytes of a safetensors file holding `tensors` in the given order, each written contiguous from the CPU in
// its own dtype (float32/16, bfloat16, float64, int64/32, uint8, bool), header padded with spaces to a multiple
// of 8 so the data section stays aligned. Throws std::invalid_argument for duplicate or reserved names,
// undefined tensors and unsupported dtypes.
std::string serialize(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata = {});
// serialize(), written atomically to `path` (vit::write_file_atomic); errors name the path.
void write(const std::string& path, const NamedTensors& tensors,
           const std::map<std::string, std::string>& metadata = {});

}  // namespace vit::safetensors
