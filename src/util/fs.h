// Checked file I/O: every failure names the file and the operation; writes are atomic (temp file, then rename).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace vit {

// Reads a whole regular file; throws std::runtime_error("<path>: cannot open: <reason>") and similar.
std::string read_file(const std::string& path);
// Reads a whole regular file of at most `max_bytes`. Only regular files are read (links are followed): a directory,
// FIFO, socket or device is refused by its type, a larger file by its size, both before any byte is read, so no
// read ever waits on a pipe or runs on without end (/dev/zero).
std::string read_regular_file(const std::string& path, uint64_t max_bytes);
// Throws "<path>: is a FIFO (named pipe), not a regular file" (and the like) unless `path` names a regular file, or
// a link to one; for readers (zlib's, libarchive's) that would otherwise wait on a pipe.
void require_regular_file(const std::string& path);
// What kind of file `status.st_mode` describes, for messages: "a directory", "a FIFO (named pipe)", ...
std::string file_kind(unsigned mode);
// Writes `bytes` to `path` atomically: a sibling temp file is written, flushed, fsync'ed and renamed over `path`,
// so a crash leaves either the old file or the new one, never a partial file under the final name.
void write_file_atomic(const std::string& path, std::string_view bytes);
// Creates a directory and its parents; throws with the path on failure.
void make_dirs(const std::string& path);
bool file_exists(const std::string& path);
// Lowercased extension with the dot (".jpg"), or "" when none.
std::string lower_extension(const std::string& path);
// True for the image extensions the tool decodes (.jpg .jpeg .png .bmp .tif .tiff .webp .pgm .ppm .pnm).
bool is_image_path(const std::string& path);
// Expands directories (recursively, sorted) into the image files they hold. Every other input is kept as it is, so
// that reading it reports what is wrong with that input alone: a missing path, a FIFO, a device. A directory with no
// image file in it (or that cannot be listed) is kept too, and fails as a directory when read.
std::vector<std::string> expand_image_inputs(const std::vector<std::string>& inputs);

}  // namespace vit
