// Text from files and file names made safe to print: a hostile name or field must not drive the terminal or break
// the UTF-8 of a JSON report.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace vit {

// `text` with control bytes (< 0x20, 0x7F) and bytes that are not part of valid UTF-8 written as \xNN (\n, \r, \t as
// themselves escaped: \\n, \\r, \\t); backslash stays as it is. Valid UTF-8 passes unchanged.
std::string printable(std::string_view text);

// "HxW": an image, grid or input size in every message and table (height first).
std::string size_text(int64_t height, int64_t width);
// The same as --img-size spells it: "N" for a square, else "HxW".
std::string size_option_text(int64_t height, int64_t width);

}  // namespace vit
