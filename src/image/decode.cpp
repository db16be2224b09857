// OpenCV decoding plus the checks OpenCV skips: libjpeg and libpng hand back a partly grey image for a truncated
// file with only a warning on stderr, so JPEG and PNG streams are walked for their end marker first.
#include "image/decode.h"

#include <cstring>
#include <limits>
#include <mutex>
#include <stdexcept>

#include <opencv2/core.hpp>
#include <opencv2/core/utils/logger.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "util/fs.h"

namespace vit {
namespace {

enum class Stream { complete, truncated, unknown };

// Walks JPEG segments and entropy-coded data to the EOI marker (0xFFD9). Bytes after EOI are allowed (some writers
// append data); running out of bytes before EOI is a truncated file. An unexpected layout is left to the decoder.
Stream jpeg_stream(const std::string& bytes) {
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
      // Entropy-coded scan: runs until a marker other than a stuffed 0xFF00 or a restart marker.
      for (;;) {
        if (pos + 1 >= size) return Stream::truncated;
        if (data[pos] != 0xFF) {
          ++pos;
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

}  // namespace

RawImage decode_image(const std::string& path) { return decode_image_bytes(read_file(path), path); }

RawImage decode_image_bytes(const std::string& bytes, const std::string& path_for_errors) {
  const std::string& path = path_for_errors;
  if (bytes.empty()) throw std::runtime_error(path + ": empty file (0 bytes)");
  if (starts_with(bytes, "\xFF\xD8\xFF", 3) && jpeg_stream(bytes) == Stream::truncated) {
    throw std::runtime_error(path + ": truncated JPEG (no end-of-image marker; the file is cut short)");
  }
  if (starts_with(bytes, "\x89PNG\r\n\x1A\n", 8) && png_stream(bytes) == Stream::truncated) {
    throw std::runtime_error(path + ": truncated PNG (no IEND chunk; the file is cut short)");
  }
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    throw std::runtime_error(path + ": " + std::to_string(bytes.size()) + " bytes is too large to decode (2 GiB max)");
  }
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
