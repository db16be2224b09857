// Safetensors reader/writer: every header field is checked against the file before any tensor is touched, and
// tensors are copied out of the file buffer, so they never alias memory that dies with the Archive.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "util/fs.h"
#include "util/text.h"

// The on-disk integers and tensor data are little-endian and are copied byte for byte.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes a little-endian host");

namespace vit::safetensors {
namespace {

using Json = nlohmann::ordered_json;  // ordered: tensors keep the order the file lists them in

// The reference implementation's limit; a larger "header" means the file is something else or hostile.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kSupported = "F32, F16, BF16, F64, I64, I32, I8, U8, BOOL";
constexpr DType kAllDTypes[] = {DType::F32, DType::F16, DType::BF16, DType::F64,
                                DType::I64, DType::I32, DType::I8,   DType::U8, DType::BOOL};

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

// Appended, not "'" + std::string&&: GCC 12 in C++20 mode warns falsely (-Wstringop-overflow) on that.
std::string quoted(const std::string& name) {
  std::string out = "'";
  out += printable(name);
  out += "'";
  return out;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

bool parse_dtype(const std::string& name, DType& dtype) {
  for (DType candidate : kAllDTypes) {
    if (name == dtype_name(candidate)) {
      dtype = candidate;
      return true;
    }
  }
  return false;
}

bool from_scalar_type(torch::ScalarType type, DType& dtype) {
  for (DType candidate : kAllDTypes) {
    if (to_scalar_type(candidate) == type) {
      dtype = candidate;
      return true;
    }
  }
  return false;
}

// Element count times item size, or false on overflow (a hostile shape such as [2^40, 2^40]).
bool byte_count(const std::vector<int64_t>& shape, DType dtype, uint64_t& bytes) {
  uint64_t count = 1;
  for (int64_t dim : shape) {
    if (__builtin_mul_overflow(count, static_cast<uint64_t>(dim), &count)) return false;
  }
  return !__builtin_mul_overflow(count, static_cast<uint64_t>(itemsize(dtype)), &bytes);
}

// A JSON integer as a non-negative value; `what` names the field in the error.
uint64_t non_negative(const Json& value, const std::string& path, const std::string& what) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer()) fail(path, what + " is negative (" + std::to_string(value.get<int64_t>()) + ")");
  fail(path, what + " is a JSON " + value.type_name() + ", expected an integer");
}

const Json& field(const Json& entry, const char* key, const std::string& path, const std::string& name) {
  auto it = entry.find(key);
  if (it == entry.end()) fail(path, "tensor " + quoted(name) + ": missing \"" + key + "\"");
  return *it;
}

TensorInfo parse_entry(const std::string& name, const Json& entry, uint64_t data_size, const std::string& path) {
  const std::string tensor = "tensor " + quoted(name);
  if (!entry.is_object()) fail(path, tensor + ": entry is a JSON " + entry.type_name() + ", expected an object");
  TensorInfo info;
  info.name = name;

  const Json& dtype = field(entry, "dtype", path, name);
  if (!dtype.is_string()) fail(path, tensor + ": \"dtype\" is a JSON " + dtype.type_name() + ", expected a string");
  if (!parse_dtype(dtype.get<std::string>(), info.dtype)) {
    fail(path, tensor + ": unsupported dtype " + quoted(dtype.get<std::string>()) + " (supported: " + kSupported + ")");
  }

  const Json& shape = field(entry, "shape", path, name);
  if (!shape.is_array()) fail(path, tensor + ": \"shape\" is a JSON " + shape.type_name() + ", expected an array");
  for (const Json& dim : shape) {
    const uint64_t value = non_negative(dim, path, tensor + ": shape dimension");
    if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail(path, tensor + ": shape dimension " + std::to_string(value) + " is too large");
    }
    info.shape.push_back(static_cast<int64_t>(value));
  }

  const Json& offsets = field(entry, "data_offsets", path, name);
  if (!offsets.is_array() || offsets.size() != 2) {
    fail(path, tensor + ": \"data_offsets\" must be an array [begin, end], found " + printable(offsets.dump()));
  }
  info.begin = non_negative(offsets[0], path, tensor + ": data_offsets begin");
  info.end = non_negative(offsets[1], path, tensor + ": data_offsets end");
  const std::string range = "[" + std::to_string(info.begin) + ", " + std::to_string(info.end) + "]";
  if (info.begin > info.end) fail(path, tensor + ": data_offsets " + range + " have begin > end");
  if (info.end > data_size) {
    fail(path, tensor + ": data_offsets end " + std::to_string(info.end) + " is beyond the data section size " +
                   std::to_string(data_size) + " (truncated file?)");
  }

  uint64_t expected = 0;
  if (!byte_count(info.shape, info.dtype, expected)) {
    fail(path, tensor + ": shape " + shape_string(info.shape) + " is too large");
  }
  if (expected != info.end - info.begin) {
    fail(path, tensor + ": shape " + shape_string(info.shape) + " of " + dtype_name(info.dtype) + " needs " +
                   std::to_string(expected) + " bytes but data_offsets " + range + " hold " +
                   std::to_string(info.end - info.begin));
  }
  return info;
}

std::map<std::string, std::string> parse_metadata(const Json& metadata, const std::string& path) {
  if (!metadata.is_object()) {
    fail(path, std::string("\"__metadata__\" is a JSON ") + metadata.type_name() + ", expected an object");
  }
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : metadata.items()) {
    if (!value.is_string()) {
      fail(path,
           "\"__metadata__\" value for " + quoted(key) + " is a JSON " + value.type_name() + ", expected a string");
    }
    out[key] = value.get<std::string>();
  }
  return out;
}

}  // namespace

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::F64: return "F64";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::I8: return "I8";
    case DType::U8: return "U8";
    case DType::BOOL: return "BOOL";
  }
  return "?";
}

size_t itemsize(DType dtype) {
  switch (dtype) {
    case DType::F64:
    case DType::I64: return 8;
    case DType::F32:
    case DType::I32: return 4;
    case DType::F16:
    case DType::BF16: return 2;
    case DType::I8:
    case DType::U8:
    case DType::BOOL: return 1;
  }
  return 1;
}

torch::ScalarType to_scalar_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return torch::kFloat32;
    case DType::F16: return torch::kFloat16;
    case DType::BF16: return torch::kBFloat16;
    case DType::F64: return torch::kFloat64;
    case DType::I64: return torch::kInt64;
    case DType::I32: return torch::kInt32;
    case DType::I8: return torch::kInt8;
    case DType::U8: return torch::kUInt8;
    case DType::BOOL: return torch::kBool;
  }
  return torch::kFloat32;
}

namespace {

const TensorInfo* find_in(const std::vector<TensorInfo>& tensors, const std::string& name) {
  for (const TensorInfo& info : tensors) {
    if (info.name == name) return &info;
  }
  return nullptr;
}

// Checks the 8-byte header length against the file size; returns it.
uint64_t checked_header_length(const char* first8, uint64_t size, const std::string& path) {
  if (size < 8) {
    fail(path, "file is " + std::to_string(size) + " bytes, too short for the 8-byte header length (not safetensors?)");
  }
  uint64_t header_length = 0;
  std::memcpy(&header_length, first8, sizeof header_length);
  if (header_length > kMaxHeaderBytes) {
    fail(path, "header length " + std::to_string(header_length) + " exceeds the limit of " +
                   std::to_string(kMaxHeaderBytes) + " bytes (not safetensors?)");
  }
  if (header_length > size - 8) {
    fail(path, "header length " + std::to_string(header_length) + " exceeds file size " + std::to_string(size) +
                   " (truncated file?)");
  }
  return header_length;
}

// Parses and validates the JSON header of a file with `data_size` bytes of data after it.
void parse_header(const char* text, uint64_t length, uint64_t data_size, const std::string& path,
                  std::map<std::string, std::string>& metadata, std::vector<TensorInfo>& tensors) {
  Json header;
  try {
    header = Json::parse(text, text + length);
  } catch (const Json::parse_error& error) {
    fail(path, std::string("header is not valid JSON: ") + printable(error.what()));
  }
  if (!header.is_object()) fail(path, std::string("header is a JSON ") + header.type_name() + ", expected an object");
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      metadata = parse_metadata(entry, path);
    } else {
      tensors.push_back(parse_entry(name, entry, data_size, path));
    }
  }
}

// Re-checked at read time because a TensorInfo may have been built by hand or taken from another file.
void check_fits(const TensorInfo& info, uint64_t data_size, const std::string& path, uint64_t& nbytes) {
  if (!byte_count(info.shape, info.dtype, nbytes) || info.begin > info.end || nbytes != info.end - info.begin ||
      info.end > data_size) {
    fail(path, "tensor " + quoted(info.name) + ": shape " + shape_string(info.shape) + " and data_offsets [" +
                   std::to_string(info.begin) + ", " + std::to_string(info.end) +
                   "] do not fit this file's data section");
  }
}

// A tensor of the file's dtype to receive `info`'s bytes (bool is read as bytes, see finish_tensor).
torch::Tensor storage_for(const TensorInfo& info) {
  const torch::ScalarType storage = info.dtype == DType::BOOL ? torch::kUInt8 : to_scalar_type(info.dtype);
  return torch::empty(info.shape, torch::TensorOptions().dtype(storage));
}

// A new tensor for `info`: checked against the data section, filled by `copy(destination, nbytes)` from wherever
// the bytes are (memory or the open file). Bool is read as bytes and compared with zero: any byte other than 0/1 in
// a torch bool is undefined behaviour.
template <typename Copy>
torch::Tensor new_tensor(const TensorInfo& info, uint64_t data_size, const std::string& path, bool as_float32,
                         Copy&& copy) {
  uint64_t nbytes = 0;
  check_fits(info, data_size, path, nbytes);
  torch::Tensor raw = storage_for(info);
  if (nbytes > 0) copy(raw.data_ptr(), nbytes);
  if (info.dtype == DType::BOOL) return raw.ne(0);
  const bool floating = info.dtype == DType::F16 || info.dtype == DType::BF16 || info.dtype == DType::F64;
  if (as_float32 && floating) return raw.to(torch::kFloat32);
  return raw;
}

}  // namespace

Archive parse(std::string bytes, const std::string& path_for_errors) {
  const std::string& path = path_for_errors;
  const uint64_t size = bytes.size();
  const uint64_t header_length = checked_header_length(bytes.data(), size, path);
  Archive archive;
  archive.path = path;
  archive.data_start = 8 + header_length;
  parse_header(bytes.data() + 8, header_length, size - archive.data_start, path, archive.metadata, archive.tensors);
  archive.bytes = std::move(bytes);
  return archive;
}

const TensorInfo* Archive::find(const std::string& name) const { return find_in(tensors, name); }

torch::Tensor Archive::tensor(const TensorInfo& info, bool as_float32) const {
  const uint64_t data_size = bytes.size() >= data_start ? bytes.size() - data_start : 0;
  return new_tensor(info, data_size, path, as_float32, [&](void* out, uint64_t nbytes) {
    std::memcpy(out, bytes.data() + data_start + info.begin, nbytes);
  });
}

torch::Tensor Archive::tensor(const std::string& name, bool as_float32) const {
  const TensorInfo* info = find(name);
  if (!info) fail(path, "no tensor named " + quoted(name));
  return tensor(*info, as_float32);
}

Archive read(const std::string& path) { return parse(read_file(path), path); }

File::File(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  try {
    struct stat info {};
    if (::fstat(fd_, &info) != 0) fail(path, std::string("cannot stat: ") + std::strerror(errno));
    if (!S_ISREG(info.st_mode)) fail(path, "not a regular file");
    const auto size = static_cast<uint64_t>(info.st_size);
    char first8[8] = {};
    if (size >= 8) read_bytes(0, first8, 8, "the header length");
    const uint64_t header_length = checked_header_length(first8, size, path);
    std::string header(header_length, '\0');
    read_bytes(8, header.data(), header_length, "the header");
    data_start_ = 8 + header_length;
    data_size_ = size - data_start_;
    parse_header(header.data(), header_length, data_size_, path, metadata_, tensors_);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

File::~File() { ::close(fd_); }

const TensorInfo* File::find(const std::string& name) const { return find_in(tensors_, name); }

void File::read_bytes(uint64_t offset, void* out, uint64_t count, const std::string& what) const {
  auto* cursor = static_cast<char*>(out);
  while (count > 0) {
    const ssize_t got = ::pread(fd_, cursor, count, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) fail(path_, "cannot read " + what + ": " + std::strerror(errno));
    if (got == 0) fail(path_, "file ended while reading " + what + " (truncated while being read?)");
    cursor += got, offset += static_cast<uint64_t>(got), count -= static_cast<uint64_t>(got);
  }
}

void File::read_into(const TensorInfo& info, torch::Tensor dst) const {
  if (dst.sizes() != c10::IntArrayRef(info.shape)) {
    fail(path_, "tensor " + quoted(info.name) + " has shape " + shape_string(info.shape) +
                    ", the destination has " + shape_string(dst.sizes().vec()));
  }
  const bool direct = info.dtype != DType::BOOL && dst.scalar_type() == to_scalar_type(info.dtype) &&
                      dst.device().is_cpu() && dst.is_contiguous();
  if (!direct) {
    torch::NoGradGuard no_grad;
    dst.copy_(tensor(info, /*as_float32=*/false));
    return;
  }
  uint64_t nbytes = 0;
  check_fits(info, data_size_, path_, nbytes);
  if (nbytes > 0) read_bytes(data_start_ + info.begin, dst.data_ptr(), nbytes, "tensor " + quoted(info.name));
}

torch::Tensor File::tensor(const TensorInfo& info, bool as_float32) const {
  return new_tensor(info, data_size_, path_, as_float32, [&](void* out, uint64_t nbytes) {
    read_bytes(data_start_ + info.begin, out, nbytes, "tensor " + quoted(info.name));
  });
}

std::string serialize(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  // Python's safetensors writes metadata first; following it keeps our files diffable against theirs.
  if (!metadata.empty()) header["__metadata__"] = metadata;

  std::vector<torch::Tensor> contiguous;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name == "__metadata__") throw std::invalid_argument("tensor name '__metadata__' is reserved by safetensors");
    if (!names.insert(name).second) throw std::invalid_argument("duplicate tensor name " + quoted(name));
    if (!tensor.defined()) throw std::invalid_argument("tensor " + quoted(name) + " is undefined");
    DType dtype;
    if (!from_scalar_type(tensor.scalar_type(), dtype)) {
      throw std::invalid_argument("tensor " + quoted(name) + " has dtype " + c10::toString(tensor.scalar_type()) +
                                  ", which safetensors writing does not support (supported: " + kSupported + ")");
    }
    torch::Tensor cpu = tensor.detach().to(torch::kCPU).contiguous();
    const uint64_t nbytes = static_cast<uint64_t>(cpu.numel()) * itemsize(dtype);
    header[name] = {
        {"dtype", dtype_name(dtype)}, {"shape", cpu.sizes().vec()}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    contiguous.push_back(std::move(cpu));
  }

  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const Json::exception& error) {
    throw std::invalid_argument(std::string("tensor names and metadata must be valid UTF-8: ") + error.what());
  }
  // Padding to a multiple of 8 puts the data section on an 8-byte boundary, so readers may map it in place.
  header_text.append((8 - header_text.size() % 8) % 8, ' ');

  std::string out;
  out.reserve(8 + header_text.size() + offset);
  const uint64_t header_length = header_text.size();
  out.append(reinterpret_cast<const char*>(&header_length), sizeof header_length);
  out += header_text;
  for (const torch::Tensor& tensor : contiguous) {
    if (tensor.numel() == 0) continue;  // an empty tensor may have no storage at all
    out.append(static_cast<const char*>(tensor.data_ptr()), tensor.numel() * tensor.element_size());
  }
  return out;
}

void write(const std::string& path, const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  std::string bytes;
  try {
    bytes = serialize(tensors, metadata);
  } catch (const std::invalid_argument& error) {
    throw std::invalid_argument(path + ": " + error.what());
  }
  write_file_atomic(path, bytes);
}

}  // namespace vit::safetensors
