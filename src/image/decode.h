// Image decoding with OpenCV (and libjpeg for a training crop's window) into the data pipeline's RawImage (HWC,
// RGB(A), 8-bit), with one-line errors that name the file for empty, unrecognised, truncated or unsupported images.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "data/image.h"

namespace vit {

// Reads the file (vit::read_file) and decodes it.
RawImage decode_image(const std::string& path);
// Decodes encoded bytes (any format OpenCV reads; 1, 3 or 4 channels; 8- or 16-bit, 16-bit scaled to 8-bit by
// /257 with rounding). Errors start with `path_for_errors`. Thread-safe.
RawImage decode_image_bytes(const std::string& bytes, const std::string& path_for_errors);

// A JPEG's size and channels from its header (nullopt for other files, and for CMYK JPEGs).
std::optional<ImageSize> jpeg_size(const std::string& bytes);
// A window of a JPEG decoded through libjpeg at 1/scale (1, 2, 4, 8): DCT scaling, then only the window's columns
// (jpeg_crop_scanline) and rows (jpeg_skip_scanlines above it, stopping below it) go through the inverse DCT and
// colour conversion. Returns rows [floor(top/scale), ceil((top+height)/scale)) of the scaled image (clamped), and
// the same for columns, RGB or grey. Errors as decode_image_bytes's.
RawImage decode_jpeg_window(const std::string& bytes, const std::string& path_for_errors, const ImageWindow& window,
                            int scale);

// The data pipeline's codec: decode_image_bytes, and for JPEGs jpeg_size and decode_jpeg_window.
std::shared_ptr<const ImageCodec> image_codec();

}  // namespace vit
