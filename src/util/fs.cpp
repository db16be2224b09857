// Checked file I/O: every failure names the file and the operation, with the OS's reason (strerror).
#include "util/fs.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>

namespace vit {
namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& operation, int error_number) {
  throw std::runtime_error(path + ": cannot " + operation + ": " + std::strerror(error_number));
}

// Best effort: makes the rename itself durable. Some file systems refuse fsync on a directory (EINVAL),
// and the new file's contents are already on disk by then, so a failure here is not worth failing the write for.
void sync_parent_directory(const std::string& path) {
  fs::path parent = fs::path(path).parent_path();
  const std::string directory = parent.empty() ? std::string(".") : parent.string();
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

std::string read_file(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (!file) fail(path, "open for reading", errno);
  std::string bytes;
  char buffer[1 << 16];
  for (;;) {
    const size_t count = std::fread(buffer, 1, sizeof buffer, file);
    bytes.append(buffer, count);
    if (count < sizeof buffer) break;
  }
  const bool read_error = std::ferror(file) != 0;
  const int saved_errno = errno;
  std::fclose(file);
  // fopen succeeds on a directory; the failure only shows up as EISDIR on the first read.
  if (read_error) fail(path, "read", saved_errno);
  return bytes;
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  // Same directory as the target, so the rename never crosses file systems; the pid keeps concurrent writers
  // (e.g. several ranks) from sharing one temp file.
  const std::string temp_path = path + ".tmp." + std::to_string(::getpid());
  std::FILE* file = std::fopen(temp_path.c_str(), "wb");
  if (!file) fail(temp_path, "open for writing", errno);

  auto abandon = [&](const std::string& operation, int error_number) {
    std::fclose(file);
    std::remove(temp_path.c_str());
    fail(temp_path, operation, error_number);
  };
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), file) != bytes.size()) abandon("write", errno);
  if (std::fflush(file) != 0) abandon("flush", errno);
  // Without fsync a crash after the rename can leave the final name pointing at an empty or partial file.
  if (::fsync(::fileno(file)) != 0) abandon("fsync", errno);
  if (std::fclose(file) != 0) {
    const int saved_errno = errno;
    std::remove(temp_path.c_str());
    fail(temp_path, "close", saved_errno);
  }
  if (std::rename(temp_path.c_str(), path.c_str()) != 0) {
    const int saved_errno = errno;
    std::remove(temp_path.c_str());
    throw std::runtime_error(path + ": cannot rename " + temp_path + " over it: " + std::strerror(saved_errno));
  }
  sync_parent_directory(path);
}

void make_dirs(const std::string& path) {
  // "" is the parent of a bare file name: the current directory, which exists.
  if (path.empty()) return;
  std::error_code error;
  fs::create_directories(path, error);
  if (error) throw std::runtime_error(path + ": cannot create directory: " + error.message());
  // create_directories reports success when the path exists as a regular file.
  if (!fs::is_directory(path, error)) throw std::runtime_error(path + ": cannot create directory: not a directory");
}

bool file_exists(const std::string& path) {
  std::error_code error;
  return fs::exists(path, error);
}

std::string lower_extension(const std::string& path) {
  std::string extension = fs::path(path).extension().string();
  std::transform(extension.begin(), extension.end(), extension.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return extension;
}

bool is_image_path(const std::string& path) {
  static const char* const kExtensions[] = {".jpg",  ".jpeg", ".png", ".bmp", ".tif",
                                            ".tiff", ".webp", ".pgm", ".ppm", ".pnm"};
  const std::string extension = lower_extension(path);
  return std::any_of(std::begin(kExtensions), std::end(kExtensions),
                     [&](const char* known) { return extension == known; });
}

std::vector<std::string> expand_image_inputs(const std::vector<std::string>& inputs) {
  std::vector<std::string> images;
  for (const std::string& input : inputs) {
    std::error_code error;
    const fs::file_status status = fs::status(input, error);
    if (status.type() == fs::file_type::not_found) throw std::runtime_error(input + ": no such file or directory");
    if (error) throw std::runtime_error(input + ": cannot access: " + error.message());
    if (!fs::is_directory(status)) {
      // A file named explicitly is taken as is: the decoder reports it clearly if it is not an image.
      images.push_back(input);
      continue;
    }
    // Sorted so that runs (and their outputs) are reproducible whatever order the directory lists in.
    std::vector<std::string> found;
    fs::recursive_directory_iterator it(input, error), end;
    if (error) throw std::runtime_error(input + ": cannot list directory: " + error.message());
    for (; !error && it != end; it.increment(error)) {
      std::error_code entry_error;  // a dangling symlink is simply not a regular file: skipped
      if (it->is_regular_file(entry_error) && is_image_path(it->path().string())) found.push_back(it->path().string());
    }
    if (error) throw std::runtime_error(input + ": cannot list directory: " + error.message());
    std::sort(found.begin(), found.end());
    images.insert(images.end(), found.begin(), found.end());
  }
  return images;
}

}  // namespace vit
