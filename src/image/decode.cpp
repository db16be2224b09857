// OpenCV decoding plus the checks OpenCV skips: libjpeg and libpng hand back a partly grey image for a truncated
// file with only a warning on stderr, so JPEG and PNG streams are walked for their end marker first.
#include "image/decode.h"

#include <algorithm>
#include <cctype>
#include <csetjmp>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>
#include <stdexcept>

#include <opencv2/core.hpp>
#include <opencv2/core/utils/logger.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <jpeglib.h>

#include "util/fs.h"

namespace vit {
namespace {

enum class Stream { complete, truncated, unknown };

// Walks JPEG segments and entropy-coded data to the EOI marker (0xFFD9). Bytes after EOI are allowed (some writers
// append data); running out of bytes before EOI is a truncated file. An unexpected layout is left to the decoder.
// Counts the scans (SOS markers) on the way into `scans`: a progressive JPEG of a few kilobytes can hold thousands of
// tiny scans, each a pass over the whole image.
Stream jpeg_stream(const std::string& bytes, int64_t& scans) {
  scans = 0;
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t size = bytes.size();
  size_t pos = 2;  // after SOI
  for (;;) {
    if (pos >= size) return Stream::truncated;
    if (data[pos] != 0xFF) return Stream::unknown;
    while (pos < size && data[pos] == 0xFF) ++pos;  // fill bytes
    if (pos >= size) return Stream::truncated;
    const unsigned char marker = data[pos++];
    if (marker == 0xD9) return Stream::complete;
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) continue;  // TEM, RSTn: no length field
    if (pos + 2 > size) return Stream::truncated;
    const size_t length = (size_t{data[pos]} << 8) | data[pos + 1];
    if (length < 2) return Stream::unknown;
    pos += length;
    if (pos > size) return Stream::truncated;
    if (marker == 0xDA) {
      ++scans;
      // Entropy-coded scan: runs until a marker other than a stuffed 0xFF00 or a restart marker.
      for (;;) {
        if (pos + 1 >= size) return Stream::truncated;
        if (data[pos] != 0xFF) {
          const void* marker = std::memchr(data + pos, 0xFF, size - pos);  // the scan is most of the file
          if (!marker) return Stream::truncated;
          pos = static_cast<size_t>(static_cast<const unsigned char*>(marker) - data);
          continue;
        }
        const unsigned char next = data[pos + 1];
        if (next == 0x00 || (next >= 0xD0 && next <= 0xD7)) {
          pos += 2;
        } else if (next == 0xFF) {
          ++pos;
        } else {
          break;
        }
      }
    }
  }
}

// Walks PNG chunks to IEND; a chunk running past the end, or no IEND, is a truncated file.
Stream png_stream(const std::string& bytes) {
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t size = bytes.size();
  size_t pos = 8;  // after the signature
  for (;;) {
    if (pos + 8 > size) return Stream::truncated;
    const size_t length = (size_t{data[pos]} << 24) | (size_t{data[pos + 1]} << 16) | (size_t{data[pos + 2]} << 8) |
                          size_t{data[pos + 3]};
    const bool iend = std::memcmp(data + pos + 4, "IEND", 4) == 0;
    pos += 12 + length;  // length, type, data, CRC
    if (pos > size) return Stream::truncated;
    if (iend) return Stream::complete;
  }
}

bool starts_with(const std::string& bytes, const char* magic, size_t length) {
  return bytes.size() >= length && std::memcmp(bytes.data(), magic, length) == 0;
}

const char* depth_name(int depth) {
  switch (depth) {
    case CV_8S: return "8-bit signed";
    case CV_16S: return "16-bit signed";
    case CV_32S: return "32-bit integer";
    case CV_32F: return "32-bit float";
    case CV_64F: return "64-bit float";
    default: return "unknown";
  }
}

void quiet_opencv() {
  // OpenCV logs a warning for every undecodable file; our own error says it once, with the path.
  static std::once_flag once;
  std::call_once(once, [] { cv::utils::logging::setLogLevel(cv::utils::logging::LOG_LEVEL_ERROR); });
}

bool is_jpeg(const std::string& bytes) { return starts_with(bytes, "\xFF\xD8\xFF", 3); }

// ---- libjpeg, for windows at reduced scale ----

// libjpeg reports errors by calling error_exit, which must not return: it jumps back to the setjmp of the call that
// started the work, with the message kept. The functions below hold no C++ objects across that jump.
struct JpegError {
  jpeg_error_mgr manager;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_error_exit(j_common_ptr info) {
  auto* error = reinterpret_cast<JpegError*>(info->err);
  (*info->err->format_message)(info, error->message);
  std::longjmp(error->jump, 1);
}

void jpeg_no_output(j_common_ptr) {}  // warnings (corrupt data the decoder recovers from) stay quiet, as in OpenCV

struct JpegHeader {
  int height = 0, width = 0, components = 0;
};

struct JpegWindowRequest {
  int top = 0, left = 0, bottom = 0, right = 0;  // window in the scaled image's pixels
  int scale = 1;
  int channels = 3;
};

// Reads the header into `header`; with a request, then decodes rows [top, bottom) x columns [left, right) of the
// image at 1/scale into `out` (rows * columns * channels bytes, sized by the caller from the scaled image) through
// `row_buffer` (one scaled row). False (with error.message) on a libjpeg error.
bool run_jpeg(const std::string& bytes, JpegHeader& header, const JpegWindowRequest* request, unsigned char* out,
              unsigned char* row_buffer, JpegError& error) {
  jpeg_decompress_struct info;
  info.err = jpeg_std_error(&error.manager);
  error.manager.error_exit = jpeg_error_exit;
  error.manager.output_message = jpeg_no_output;
  jpeg_create_decompress(&info);
  if (setjmp(error.jump)) {
    jpeg_destroy_decompress(&info);
    return false;
  }
  jpeg_mem_src(&info, reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&info, TRUE);
  header = {static_cast<int>(info.image_height), static_cast<int>(info.image_width), info.num_components};
  if (request) {
    info.scale_num = 1;
    info.scale_denom = static_cast<unsigned int>(request->scale);
    info.out_color_space = request->channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_start_decompress(&info);
    // crop_scanline widens the column range to whole iMCUs: `first` is where the decoded rows begin.
    JDIMENSION first = static_cast<JDIMENSION>(request->left);
    JDIMENSION width = static_cast<JDIMENSION>(request->right - request->left);
    if (width < info.output_width) jpeg_crop_scanline(&info, &first, &width);
    if (request->top > 0) jpeg_skip_scanlines(&info, static_cast<JDIMENSION>(request->top));
    const size_t row_bytes = static_cast<size_t>(request->right - request->left) * request->channels;
    const size_t skip = static_cast<size_t>(request->left - static_cast<int>(first)) * request->channels;
    for (int y = request->top; y < request->bottom; ++y) {
      JSAMPROW row = row_buffer;
      jpeg_read_scanlines(&info, &row, 1);
      std::memcpy(out + static_cast<size_t>(y - request->top) * row_bytes, row_buffer + skip, row_bytes);
    }
    jpeg_abort_decompress(&info);  // the rows below the window are never decoded
  }
  jpeg_destroy_decompress(&info);
  return true;
}

// ---- headers: the size an image declares, read without decoding ----

uint32_t be16(const unsigned char* p) { return (uint32_t{p[0]} << 8) | p[1]; }
uint32_t le16(const unsigned char* p) { return (uint32_t{p[1]} << 8) | p[0]; }
uint32_t be32(const unsigned char* p) { return (be16(p) << 16) | be16(p + 2); }
uint32_t le32(const unsigned char* p) { return (le16(p + 2) << 16) | le16(p); }

std::string hex_prefix(const std::string& bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < std::min<size_t>(bytes.size(), 4); ++i) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    out += std::string(i ? " " : "") + kHex[c >> 4] + kHex[c & 15];
  }
  return out;
}

// TIFF: the first image file directory's ImageWidth (256) and ImageLength (257), SHORT or LONG.
bool tiff_size(const unsigned char* data, size_t size, int64_t& height, int64_t& width) {
  const bool little = data[0] == 'I';
  const auto u16 = [&](size_t at) { return little ? le16(data + at) : be16(data + at); };
  const auto u32 = [&](size_t at) { return little ? le32(data + at) : be32(data + at); };
  const size_t directory = u32(4);
  if (directory > size || size - directory < 2) return false;
  const size_t entries = u16(directory);
  for (size_t i = 0; i < entries; ++i) {
    const size_t at = directory + 2 + 12 * i;
    if (at + 12 > size) return false;
    const uint32_t tag = u16(at), type = u16(at + 2);
    if (tag != 256 && tag != 257) continue;
    int64_t value = -1;
    if (type == 3) value = u16(at + 8);  // SHORT, left-justified in the value field
    if (type == 4) value = u32(at + 8);  // LONG
    (tag == 256 ? width : height) = value;
  }
  return width >= 0 && height >= 0;
}

// PNM: "P1".."P6", then width and height as decimal numbers, with whitespace and # comments between.
bool pnm_size(const unsigned char* data, size_t size, int64_t& height, int64_t& width) {
  size_t pos = 2;
  const auto number = [&](int64_t& out) {
    for (;;) {
      while (pos < size && std::isspace(data[pos])) ++pos;
      if (pos < size && data[pos] == '#') {
        while (pos < size && data[pos] != '\n' && data[pos] != '\r') ++pos;
        continue;
      }
      break;
    }
    if (pos >= size || !std::isdigit(data[pos])) return false;
    out = 0;
    for (; pos < size && std::isdigit(data[pos]); ++pos) {
      out = out * 10 + (data[pos] - '0');
      if (out > (int64_t{1} << 40)) return false;  // far past any limit; stops the overflow
    }
    return true;
  };
  return number(width) && number(height);
}

}  // namespace

ImageHeader read_image_header(const std::string& bytes, const std::string& path_for_errors) {
  const std::string& path = path_for_errors;
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t size = bytes.size();
  if (size == 0) throw std::runtime_error(path + ": empty file (0 bytes)");
  ImageHeader header;
  auto cut_short = [&]() {
    return std::runtime_error(path + ": " + header.format + " header cut short or malformed (" +
                              std::to_string(size) + " bytes)");
  };
  if (is_jpeg(bytes)) {
    header.format = "JPEG";
    JpegHeader jpeg;
    JpegError error;
    if (!run_jpeg(bytes, jpeg, nullptr, nullptr, nullptr, error)) {
      throw std::runtime_error(path + ": not a decodable JPEG (" + std::string(error.message) + ")");
    }
    header.height = jpeg.height;
    header.width = jpeg.width;
  } else if (starts_with(bytes, "\x89PNG\r\n\x1A\n", 8)) {
    header.format = "PNG";
    if (size < 24 || std::memcmp(data + 12, "IHDR", 4) != 0) throw cut_short();
    header.width = be32(data + 16);
    header.height = be32(data + 20);
  } else if (starts_with(bytes, "BM", 2)) {
    header.format = "BMP";
    if (size < 26) throw cut_short();
    if (le32(data + 14) == 12) {  // OS/2 BITMAPCOREHEADER: 16-bit sizes
      header.width = le16(data + 18);
      header.height = le16(data + 20);
    } else {
      header.width = static_cast<int32_t>(le32(data + 18));
      // A negative height is a top-down bitmap.
      header.height = std::abs(static_cast<int64_t>(static_cast<int32_t>(le32(data + 22))));
    }
  } else if (starts_with(bytes, "II*\0", 4) || starts_with(bytes, "MM\0*", 4)) {
    header.format = "TIFF";
    if (size < 8 || !tiff_size(data, size, header.height, header.width)) throw cut_short();
  } else if (starts_with(bytes, "RIFF", 4) && size >= 12 && std::memcmp(data + 8, "WEBP", 4) == 0) {
    header.format = "WebP";
    if (size < 30) throw cut_short();
    if (std::memcmp(data + 12, "VP8 ", 4) == 0) {  // lossy: the key frame's 14-bit sizes
      if (data[23] != 0x9D || data[24] != 0x01 || data[25] != 0x2A) throw cut_short();
      header.width = le16(data + 26) & 0x3FFF;
      header.height = le16(data + 28) & 0x3FFF;
    } else if (std::memcmp(data + 12, "VP8L", 4) == 0) {  // lossless: 14-bit sizes minus one after 0x2F
      if (data[20] != 0x2F) throw cut_short();
      const uint32_t bits = le32(data + 21);
      header.width = (bits & 0x3FFF) + 1;
      header.height = ((bits >> 14) & 0x3FFF) + 1;
    } else if (std::memcmp(data + 12, "VP8X", 4) == 0) {  // extended: the canvas's 24-bit sizes minus one
      header.width = 1 + (le32(data + 24) & 0xFFFFFF);
      header.height = 1 + (le32(data + 27) & 0xFFFFFF);
    } else {
      throw cut_short();
    }
  } else if (size >= 2 && data[0] == 'P' && data[1] >= '1' && data[1] <= '6') {
    header.format = "PNM";
    if (!pnm_size(data, size, header.height, header.width)) throw cut_short();
  } else {
    throw std::runtime_error(path + ": not an image format vit decodes (JPEG, PNG, BMP, TIFF, WebP, PNM); the file "
                             "starts with bytes " + hex_prefix(bytes));
  }
  if (header.width <= 0 || header.height <= 0) {
    throw std::runtime_error(path + ": " + header.format + " header declares a size of " +
                             std::to_string(header.width) + "x" + std::to_string(header.height));
  }
  return header;
}

namespace {

// What the decoders would not say clearly themselves: empty, cut-short, oversized and unsupported files, each before
// any pixel is decoded.
void check_encoded(const std::string& bytes, const std::string& path, const ImageLimits& limits) {
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    throw std::runtime_error(path + ": " + std::to_string(bytes.size()) + " bytes is too large to decode (2 GiB max)");
  }
  const ImageHeader header = read_image_header(bytes, path);
  const uint64_t pixels = static_cast<uint64_t>(header.width) * static_cast<uint64_t>(header.height);
  if (pixels > static_cast<uint64_t>(limits.max_pixels)) {
    throw std::runtime_error(path + ": " + header.format + " of " + std::to_string(header.width) + "x" +
                             std::to_string(header.height) + " is " + std::to_string(pixels) +
                             " pixels, over the limit of " + std::to_string(limits.max_pixels) +
                             " (a decompression bomb?); --max-pixels raises it");
  }
  int64_t scans = 0;
  if (is_jpeg(bytes) && jpeg_stream(bytes, scans) == Stream::truncated) {
    throw std::runtime_error(path + ": truncated JPEG (no end-of-image marker; the file is cut short)");
  }
  // libjpeg-turbo's own guard (TurboJPEG's scan limit) stops at 500; real progressive files use about 10.
  constexpr int64_t kMaxJpegScans = 500;
  if (scans > kMaxJpegScans) {
    throw std::runtime_error(path + ": JPEG with " + std::to_string(scans) + " scans, over the limit of " +
                             std::to_string(kMaxJpegScans) + " (each decodes the whole image again)");
  }
  if (std::strcmp(header.format, "PNG") == 0 && png_stream(bytes) == Stream::truncated) {
    throw std::runtime_error(path + ": truncated PNG (no IEND chunk; the file is cut short)");
  }
}

}  // namespace

std::optional<ImageSize> jpeg_size(const std::string& bytes) {
  if (!is_jpeg(bytes)) return std::nullopt;
  JpegHeader header;
  JpegError error;
  if (!run_jpeg(bytes, header, nullptr, nullptr, nullptr, error)) return std::nullopt;  // decode() reports it
  if (header.components != 1 && header.components != 3) return std::nullopt;
  return ImageSize{header.height, header.width, header.components};
}

RawImage decode_jpeg_window(const std::string& bytes, const std::string& path_for_errors, const ImageWindow& window,
                            int scale) {
  const std::string& path = path_for_errors;
  check_encoded(bytes, path, ImageLimits{});
  if (scale != 1 && scale != 2 && scale != 4 && scale != 8) {
    throw std::invalid_argument(path + ": JPEG scale 1/" + std::to_string(scale) + " is not 1, 1/2, 1/4 or 1/8");
  }
  const std::optional<ImageSize> size = jpeg_size(bytes);
  if (!size) throw std::runtime_error(path + ": not a JPEG with 1 or 3 channels that can be decoded in windows");
  if (window.height <= 0 || window.width <= 0 || window.top < 0 || window.left < 0 ||
      window.top + window.height > size->height || window.left + window.width > size->width) {
    throw std::invalid_argument(path + ": window " + std::to_string(window.height) + "x" +
                                std::to_string(window.width) + " at (" + std::to_string(window.top) + ", " +
                                std::to_string(window.left) + ") is not inside the " + std::to_string(size->height) +
                                "x" + std::to_string(size->width) + " image");
  }
  // libjpeg's scaled size is ceil(size / scale).
  const auto scaled = [scale](int64_t v) { return (v + scale - 1) / scale; };
  JpegWindowRequest request;
  request.scale = scale;
  request.channels = static_cast<int>(size->channels);
  request.top = static_cast<int>(window.top / scale);
  request.left = static_cast<int>(window.left / scale);
  request.bottom = static_cast<int>(std::min(scaled(window.top + window.height), scaled(size->height)));
  request.right = static_cast<int>(std::min(scaled(window.left + window.width), scaled(size->width)));
  RawImage image{request.bottom - request.top, request.right - request.left, size->channels, {}};
  image.pixels.resize(static_cast<size_t>(image.height * image.width * image.channels));
  std::vector<unsigned char> row(static_cast<size_t>(scaled(size->width) * size->channels));
  JpegError error;
  JpegHeader header;
  if (!run_jpeg(bytes, header, &request, image.pixels.data(), row.data(), error)) {
    throw std::runtime_error(path + ": not a decodable JPEG (" + std::string(error.message) + ")");
  }
  return image;
}

std::shared_ptr<const ImageCodec> image_codec() {
  static const auto codec = std::make_shared<const ImageCodec>(ImageCodec{
      [](const std::string& bytes, const std::string& name) { return decode_image_bytes(bytes, name); }, jpeg_size,
      decode_jpeg_window});
  return codec;
}

RawImage decode_image(const std::string& path, const ImageLimits& limits) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    std::filesystem::directory_iterator listing(path, error);
    if (error) throw std::runtime_error(path + ": is a directory that cannot be listed: " + error.message());
    throw std::runtime_error(path + ": is a directory with no image files in it");
  }
  return decode_image_bytes(read_regular_file(path, static_cast<uint64_t>(limits.max_file_bytes)), path, limits);
}

RawImage decode_image_bytes(const std::string& bytes, const std::string& path_for_errors, const ImageLimits& limits) {
  const std::string& path = path_for_errors;
  check_encoded(bytes, path, limits);
  quiet_opencv();

  const cv::Mat encoded(1, static_cast<int>(bytes.size()), CV_8UC1, const_cast<char*>(bytes.data()));
  cv::Mat decoded;
  try {
    // UNCHANGED keeps the file's channels and depth, and leaves EXIF orientation alone, as PIL's open() (and so
    // timm) does.
    decoded = cv::imdecode(encoded, cv::IMREAD_UNCHANGED);
  } catch (const cv::Exception& error) {
    throw std::runtime_error(path + ": not a decodable image (format not recognised or corrupt): " + error.err);
  }
  if (decoded.empty()) throw std::runtime_error(path + ": not a decodable image (format not recognised or corrupt)");

  if (decoded.depth() == CV_16U) {
    cv::Mat scaled;
    decoded.convertTo(scaled, CV_8U, 1.0 / 257.0);  // 65535 -> 255, rounded to nearest
    decoded = scaled;
  } else if (decoded.depth() != CV_8U) {
    throw std::runtime_error(path + ": unsupported pixel depth (" + depth_name(decoded.depth()) +
                             "; expected 8- or 16-bit unsigned)");
  }
  const int channels = decoded.channels();
  if (channels != 1 && channels != 3 && channels != 4) {
    throw std::runtime_error(path + ": unsupported channel count " + std::to_string(channels) +
                             " (expected 1, 3 or 4)");
  }

  RawImage image{decoded.rows, decoded.cols, channels, {}};
  image.pixels.resize(static_cast<size_t>(image.height * image.width * channels));
  // Write straight into the RawImage's storage; cvtColor keeps a destination of the right size and type.
  cv::Mat out(decoded.rows, decoded.cols, CV_8UC(channels), image.pixels.data());
  if (channels == 3) {
    cv::cvtColor(decoded, out, cv::COLOR_BGR2RGB);
  } else if (channels == 4) {
    cv::cvtColor(decoded, out, cv::COLOR_BGRA2RGBA);
  } else {
    decoded.copyTo(out);
  }
  return image;
}

}  // namespace vit
