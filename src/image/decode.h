// Image decoding with OpenCV (and libjpeg for a training crop's window) into the data pipeline's RawImage (HWC,
// RGB(A), 8-bit), with one-line errors that name the file for empty, unrecognised, truncated or unsupported images.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "data/image.h"

namespace vit {

// The format and size an image's header declares.
struct ImageHeader {
  const char* format = "";  // "JPEG", "PNG", "BMP", "TIFF", "WebP" or "PNM"
  int64_t height = 0, width = 0;
};

// Reads the header of a JPEG, PNG, BMP, TIFF, WebP or PNM (PBM/PGM/PPM) image, the formats vit decodes. Any other
// content, a header cut short or a size of zero throws one line starting with `path_for_errors`.
ImageHeader read_image_header(const std::string& bytes, const std::string& path_for_errors);

// Reads the regular file (within limits.max_file_bytes) and decodes it. A directory gets a message of its own: from
// the command line (expand_image_inputs) only a directory without images arrives here.
RawImage decode_image(const std::string& path, const ImageLimits& limits = {});
// Decodes encoded bytes (1, 3 or 4 channels; 8- or 16-bit, 16-bit scaled to 8-bit by /257 with rounding) after
// read_image_header and the pixel limit. Errors start with `path_for_errors`. Thread-safe.
RawImage decode_image_bytes(const std::string& bytes, const std::string& path_for_errors,
                            const ImageLimits& limits = {});

// A JPEG's size and channels from its header (nullopt for other files, and for CMYK JPEGs).
std::optional<ImageSize> jpeg_size(const std::string& bytes);
// A window of a JPEG decoded through libjpeg at 1/scale (1, 2, 4, 8): DCT scaling, then only the window's columns
// (jpeg_crop_scanline) and rows (jpeg_skip_scanlines above it, stopping below it) go through the inverse DCT and
// colour conversion. Returns rows [floor(top/scale), ceil((top+height)/scale)) of the scaled image (clamped), and
// the same for columns, RGB or grey. Errors as decode_image_bytes's.
RawImage decode_jpeg_window(const std::string& bytes, const std::string& path_for_errors, const ImageWindow& window,
                            int scale);

// The data pipeline's codec: decode_image_bytes, and for JPEGs jpeg_size and decode_jpeg_window, with the default
// limits.
std::shared_ptr<const ImageCodec> image_codec();

}  // namespace vit
