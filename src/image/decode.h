// Image decoding with OpenCV into the data pipeline's RawImage (HWC, RGB(A), 8-bit), with one-line errors that
// name the file for empty, unrecognised, truncated or unsupported images.
#pragma once

#include <string>

#include "data/image.h"

namespace vit {

// Reads the file (vit::read_file) and decodes it.
RawImage decode_image(const std::string& path);
// Decodes encoded bytes (any format OpenCV reads; 1, 3 or 4 channels; 8- or 16-bit, 16-bit scaled to 8-bit by
// /257 with rounding). Errors start with `path_for_errors`. Thread-safe.
RawImage decode_image_bytes(const std::string& bytes, const std::string& path_for_errors);

}  // namespace vit
