// NumPy .npy files (format version 1.0) for float32 arrays: what export-attention and friends hand to Python.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

namespace vit {

// The complete .npy file for a float32 tensor of any shape ('<f4', C order; copied to contiguous CPU memory).
// The preamble (magic, version, length, header dict) is padded with spaces and a '\n' to a multiple of 64 bytes,
// exactly as numpy.save writes it. Throws std::invalid_argument for other dtypes or an undefined tensor.
std::string npy_bytes(const torch::Tensor& tensor);
// The preamble of a float32 .npy of `shape` (magic, version, length, header dict, padding): followed by the
// shape's values in C order, it is npy_bytes()'s file. For writers that hold the rows in pieces.
std::string npy_preamble(const std::vector<int64_t>& shape);
// npy_bytes(), written atomically; errors name the path.
void write_npy(const std::string& path, const torch::Tensor& tensor);
// Reads a '<f4' C-order .npy (versions 1.0-3.0) into a new float32 tensor; anything else throws
// std::runtime_error naming the path and what was found.
torch::Tensor read_npy(const std::string& path);

}  // namespace vit
