// Checked file I/O: every failure names the file and the operation, with the OS's reason (strerror).
#include "util/fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
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

std::string file_kind(unsigned mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

void require_regular_file(const std::string& path) {
  struct stat status {};
  if (::stat(path.c_str(), &status) != 0) fail(path, "open for reading", errno);
  if (!S_ISREG(status.st_mode)) {
    throw std::runtime_error(path + ": is " + file_kind(status.st_mode) + ", not a regular file");
  }
}

std::string read_regular_file(const std::string& path, uint64_t max_bytes) {
  // The type is checked before opening (opening a FIFO waits for a writer) and again on the open descriptor (the
  // path may have been replaced in between). O_NONBLOCK keeps even that second open from waiting.
  require_regular_file(path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) fail(path, "open for reading", errno);
  struct stat status {};
  if (::fstat(fd, &status) != 0 || !S_ISREG(status.st_mode)) {
    ::close(fd);
    throw std::runtime_error(path + ": is " + file_kind(status.st_mode) + ", not a regular file");
  }
  const auto size = static_cast<uint64_t>(status.st_size);
  if (size > max_bytes) {
    ::close(fd);
    throw std::runtime_error(path + ": " + std::to_string(size) + " bytes is over the limit of " +
                             std::to_string(max_bytes) + " bytes for this file");
  }
  std::string bytes;
  bytes.resize(static_cast<size_t>(size));
  size_t filled = 0;
  for (;;) {
    // A file that grows while it is read is read up to the limit and one byte more, to notice it.
    if (filled == bytes.size()) {
      if (bytes.size() > max_bytes) break;
      const uint64_t cap = max_bytes < std::numeric_limits<uint64_t>::max() ? max_bytes + 1 : max_bytes;
      bytes.resize(static_cast<size_t>(std::min<uint64_t>(cap, bytes.size() + (uint64_t{1} << 16))));
    }
    const ssize_t count = ::read(fd, bytes.data() + filled, bytes.size() - filled);
    if (count < 0) {
      if (errno == EINTR) continue;
      const int saved_errno = errno;
      ::close(fd);
      fail(path, "read", saved_errno);
    }
    if (count == 0) break;
    filled += static_cast<size_t>(count);
  }
  ::close(fd);
  if (filled > max_bytes) {
    throw std::runtime_error(path + ": grew past the limit of " + std::to_string(max_bytes) +
                             " bytes while it was read");
  }
  bytes.resize(filled);
  return bytes;
}

std::string read_file(const std::string& path) {
  return read_regular_file(path, std::numeric_limits<uint64_t>::max());
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  // Same directory as the target, so the rename never crosses file systems; the pid keeps concurrent writers
  // (e.g. several ranks) from sharing one temp file.
  const std::string temp_path = path + ".tmp." + std::to_string(::getpid());
  std::FILE* file = std::fopen(temp_path.c_str(), "wb");
  if (!file) fail(temp_path, "open for writing", errno);

  // A failed write (a full disk, a file-size limit) leaves `path` as it was: the temp file is removed.
  auto abandon = [&](const std::string& operation, int error_number) {
    std::fclose(file);
    std::remove(temp_path.c_str());
    throw std::runtime_error(path + ": cannot " + operation + " (its temp file " + temp_path +
                             "): " + std::strerror(error_number) + "; the previous " + path + " is unchanged");
  };
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), file) != bytes.size()) abandon("write", errno);
  if (std::fflush(file) != 0) abandon("flush", errno);
  // Without fsync a crash after the rename can leave the final name pointing at an empty or partial file.
  if (::fsync(::fileno(file)) != 0) abandon("fsync", errno);
  if (std::fclose(file) != 0) {
    const int saved_errno = errno;
    std::remove(temp_path.c_str());
    throw std::runtime_error(path + ": cannot close (its temp file " + temp_path + "): " +
                             std::strerror(saved_errno) + "; the previous " + path + " is unchanged");
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
    if (!fs::is_directory(input, error)) {
      images.push_back(input);
      continue;
    }
    // Sorted so that runs (and their outputs) are reproducible whatever order the directory lists in.
    std::vector<std::string> found;
    fs::recursive_directory_iterator it(input, error), end;
    for (; !error && it != end; it.increment(error)) {
      std::error_code entry_error;  // a dangling symlink, a FIFO, a socket: not a regular file, skipped
      if (it->is_regular_file(entry_error) && is_image_path(it->path().string())) found.push_back(it->path().string());
    }
    if (error || found.empty()) {
      images.push_back(input);
      continue;
    }
    std::sort(found.begin(), found.end());
    images.insert(images.end(), found.begin(), found.end());
  }
  return images;
}

}  // namespace vit
