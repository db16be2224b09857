// NumPy .npy writer and reader for float32 arrays, following numpy.lib.format byte for byte so that numpy.load
// reads our files and our files compare equal to numpy.save's.
#include "io/npy.h"

#include <cctype>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "util/fs.h"

// '<f4' means little-endian; the data is copied from memory as is.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "npy I/O assumes a little-endian host");

namespace vit {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLength = 6;
// numpy aligns the data to 64 bytes so that memory-mapped arrays suit any SIMD load.
constexpr size_t kAlign = 64;

// A Python tuple literal, as repr() writes it: (), (5,), (2, 3).
std::string shape_tuple(const std::vector<int64_t>& shape) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) out += ",";
  return out + ")";
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

// The text after `'key':` in a header dict, with leading spaces skipped; throws when the key is absent.
size_t value_start(const std::string& header, const std::string& key, const std::string& path) {
  size_t at = header.find("'" + key + "':");
  if (at == std::string::npos) fail(path, "npy header has no '" + key + "': " + header);
  at += key.size() + 3;
  while (at < header.size() && header[at] == ' ') ++at;
  return at;
}

std::vector<int64_t> parse_shape(const std::string& header, const std::string& path) {
  size_t at = value_start(header, "shape", path);
  const size_t close = header.find(')', at);
  if (at >= header.size() || header[at] != '(' || close == std::string::npos) {
    fail(path, "npy header has a malformed 'shape': " + header);
  }
  std::vector<int64_t> shape;
  const std::string inner = header.substr(at + 1, close - at - 1);
  size_t position = 0;
  while (position < inner.size()) {
    while (position < inner.size() && (inner[position] == ' ' || inner[position] == ',')) ++position;
    if (position == inner.size()) break;
    size_t digits = position;
    while (digits < inner.size() && std::isdigit(static_cast<unsigned char>(inner[digits]))) ++digits;
    if (digits == position || digits - position > 18) fail(path, "npy header has a malformed 'shape': " + header);
    shape.push_back(std::stoll(inner.substr(position, digits - position)));
    position = digits;
  }
  return shape;
}

}  // namespace

std::string npy_preamble(const std::vector<int64_t>& shape) {
  // Keys in sorted order and the trailing ", }" are what numpy.save writes.
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape_tuple(shape) + ", }";
  // numpy pads with 1..64 spaces (never 0), then '\n', so the preamble is a multiple of 64 bytes.
  const size_t preamble = kMagicLength + 2 + 2 + header.size() + 1;
  header.append(kAlign - preamble % kAlign, ' ');
  header += '\n';
  if (header.size() > UINT16_MAX) {
    throw std::invalid_argument("npy: header of " + std::to_string(header.size()) +
                                " bytes does not fit format version 1.0 (shape " + shape_tuple(shape) + ")");
  }
  std::string out;
  out.append(kMagic, kMagicLength);
  out += '\x01';  // major version
  out += '\x00';  // minor version
  const uint16_t header_length = static_cast<uint16_t>(header.size());
  out.append(reinterpret_cast<const char*>(&header_length), sizeof header_length);
  out += header;
  return out;
}

std::string npy_bytes(const torch::Tensor& tensor) {
  if (!tensor.defined()) throw std::invalid_argument("npy: cannot write an undefined tensor");
  if (tensor.scalar_type() != torch::kFloat32) {
    throw std::invalid_argument(std::string("npy: writes float32 tensors only, got ") +
                                c10::toString(tensor.scalar_type()));
  }
  const torch::Tensor cpu = tensor.detach().to(torch::kCPU).contiguous();
  const size_t data_bytes = static_cast<size_t>(cpu.numel()) * sizeof(float);
  std::string out = npy_preamble(cpu.sizes().vec());
  if (data_bytes > 0) out.append(static_cast<const char*>(cpu.data_ptr()), data_bytes);
  return out;
}

void write_npy(const std::string& path, const torch::Tensor& tensor) {
  std::string bytes;
  try {
    bytes = npy_bytes(tensor);
  } catch (const std::invalid_argument& error) {
    throw std::invalid_argument(path + ": " + error.what());
  }
  write_file_atomic(path, bytes);
}

torch::Tensor read_npy(const std::string& path) {
  const std::string bytes = read_file(path);
  if (bytes.size() < kMagicLength + 4 || bytes.compare(0, kMagicLength, kMagic, kMagicLength) != 0) {
    fail(path, "not a .npy file (no \\x93NUMPY magic)");
  }
  const int major = static_cast<unsigned char>(bytes[6]);
  const int minor = static_cast<unsigned char>(bytes[7]);
  // Version 1.0 has a u16 header length; 2.0 and 3.0 widen it to u32 (3.0 only changes the header's encoding).
  size_t header_start = 0;
  uint64_t header_length = 0;
  if (major == 1 && minor == 0) {
    uint16_t length = 0;
    std::memcpy(&length, bytes.data() + 8, sizeof length);
    header_start = 10;
    header_length = length;
  } else if ((major == 2 || major == 3) && minor == 0 && bytes.size() >= 12) {
    uint32_t length = 0;
    std::memcpy(&length, bytes.data() + 8, sizeof length);
    header_start = 12;
    header_length = length;
  } else {
    fail(path, "unsupported npy version " + std::to_string(major) + "." + std::to_string(minor));
  }
  if (header_start + header_length > bytes.size()) {
    fail(path,
         "npy header length " + std::to_string(header_length) + " exceeds file size " + std::to_string(bytes.size()));
  }
  std::string header = bytes.substr(header_start, header_length);
  while (!header.empty() && (header.back() == '\n' || header.back() == ' ')) header.pop_back();

  size_t at = value_start(header, "descr", path);
  if (header.compare(at, 5, "'<f4'") != 0) {
    fail(path, "npy dtype is not '<f4' (little-endian float32): " + header);
  }
  at = value_start(header, "fortran_order", path);
  if (header.compare(at, 5, "False") != 0) fail(path, "npy array is in Fortran order, only C order is read: " + header);
  const std::vector<int64_t> shape = parse_shape(header, path);

  uint64_t count = 1;
  for (int64_t dim : shape) {
    if (__builtin_mul_overflow(count, static_cast<uint64_t>(dim), &count) || count > UINT64_MAX / sizeof(float)) {
      fail(path, "npy shape " + shape_tuple(shape) + " is too large");
    }
  }
  const uint64_t data_bytes = bytes.size() - header_start - header_length;
  if (data_bytes != count * sizeof(float)) {
    fail(path, "npy data is " + std::to_string(data_bytes) + " bytes, but shape " + shape_tuple(shape) +
                   " of '<f4' needs " + std::to_string(count * sizeof(float)));
  }
  torch::Tensor out = torch::empty(shape, torch::kFloat32);
  if (data_bytes > 0) std::memcpy(out.data_ptr(), bytes.data() + header_start + header_length, data_bytes);
  return out;
}

}  // namespace vit
