// Checked file I/O: every failure names the file and the operation; writes are atomic (temp file, then rename).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace vit {

// Reads a whole file; throws std::runtime_error("<path>: cannot open: <reason>") and similar.
std::string read_file(const std::string& path);
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
// Expands files and directories (recursively, sorted) into the image files they hold; a missing path throws.
std::vector<std::string> expand_image_inputs(const std::vector<std::string>& inputs);

}  // namespace vit
