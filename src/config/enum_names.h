// Closed sets of the config (pooling, interpolation, AMP mode, dataset format, ...) are enums; each has one table of
// its JSON spellings, from which parsing, writing and error messages ("is not one of: a, b") are made.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace vit {

// Specialised next to each enum: `static constexpr std::array<const char*, N> names`, in declaration order.
template <typename E>
struct EnumNames;

template <typename E>
const char* name_of(E value) {
  return EnumNames<E>::names[static_cast<size_t>(value)];
}

// The value spelled `text`, or nullopt.
template <typename E>
std::optional<E> enum_from_name(std::string_view text) {
  const auto& names = EnumNames<E>::names;
  for (size_t i = 0; i < names.size(); ++i) {
    if (text == names[i]) return static_cast<E>(i);
  }
  return std::nullopt;
}

// "a, b, c": the allowed spellings, for error messages and help texts.
template <typename E>
std::string enum_choices(const char* separator = ", ") {
  std::string list;
  for (const char* name : EnumNames<E>::names) {
    if (!list.empty()) list += separator;
    list += name;
  }
  return list;
}

// Declares enum E's spellings: VIT_ENUM_NAMES(GlobalPool, "token", "avg").
#define VIT_ENUM_NAMES(E, ...)                                                     \
  template <>                                                                      \
  struct EnumNames<E> {                                                            \
    static constexpr auto names = std::array{__VA_ARGS__};                         \
  }

}  // namespace vit
