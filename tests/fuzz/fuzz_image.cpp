// libFuzzer target: image decoding (image/decode.h): the header reader, the whole-image decoder and the JPEG window
// decoder on arbitrary bytes. OpenCV's codecs are not instrumented: what this guards is our code around them and the
// checks made before they run (a header declaring too many pixels must be refused without decoding).
//
// Input: 8 bytes choosing the JPEG window and scale (top, left, height, width as fractions of the image, the scale
// 1/2^(b4 & 3); b5 & 1 passes the raw bytes as the window unclamped), then the encoded file.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <string>

#include "image/decode.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  const std::string bytes(reinterpret_cast<const char*>(data) + 8, size - 8);
  try {
    vit::read_image_header(bytes, "fuzz");
  } catch (const std::exception&) {
  }
  try {
    const vit::RawImage image = vit::decode_image_bytes(bytes, "fuzz");
    vit::check_image(image, "fuzz");  // a decoder that returns must return a consistent image
  } catch (const std::exception&) {
  }
  try {
    const auto jpeg = vit::jpeg_size(bytes);
    if (!jpeg) return 0;
    vit::ImageWindow window{data[0], data[1], data[2], data[3]};
    if ((data[5] & 1) == 0 && jpeg->height > 0 && jpeg->width > 0) {  // inside the image, as training crops are
      window.top = data[0] % jpeg->height;
      window.left = data[1] % jpeg->width;
      window.height = 1 + data[2] % (jpeg->height - window.top);
      window.width = 1 + data[3] % (jpeg->width - window.left);
    }
    const vit::RawImage crop = vit::decode_jpeg_window(bytes, "fuzz", window, 1 << (data[4] & 3));
    vit::check_image(crop, "fuzz window");
  } catch (const std::exception&) {
  }
  return 0;
}
