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

enum class DType { F32, F16, BF16, F64, I64, I32, I8, U8, BOOL };

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

// An open file whose header is parsed and validated up front but whose data stays on disk: each tensor is read
// when asked for, straight into its destination, so loading a model never holds the file's bytes and the weights at
// once. The file stays open, so a file replaced meanwhile (an atomic rename by a running training) is still read
// consistently from the version that was opened.
class File {
 public:
  // Throws std::runtime_error "<path>: <what is wrong>" as read() does.
  explicit File(const std::string& path);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // Bytes of the data section (what all tensors together can hold at most).
  uint64_t data_size() const { return data_size_; }
  // nullptr when absent.
  const TensorInfo* find(const std::string& name) const;
  // Reads a tensor into `dst`, which must have its shape: straight from the file into a contiguous CPU tensor of
  // the same dtype, converted otherwise (any dtype or device).
  void read_into(const TensorInfo& info, torch::Tensor dst) const;
  // A new tensor, as Archive::tensor.
  torch::Tensor tensor(const TensorInfo& info, bool as_float32 = true) const;

 private:
  void read_bytes(uint64_t offset, void* out, uint64_t count, const std::string& what) const;

  std::string path_;
  int fd_ = -1;
  std::map<std::string, std::string> metadata_;
  std::vector<TensorInfo> tensors_;
  uint64_t data_start_ = 0;  // offset of the data section in the file
  uint64_t data_size_ = 0;   // its size when the file was opened
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
