// Field lists that name each field once: VIT_VISIT_FIELDS(visit, s, a, b, c) calls visit("a", s.a), visit("b", s.b),
// visit("c", s.c), so a JSON key is always its field's name (config sections, the training state, history records).
// VIT_KEY (util/field_key.h) names one field's key in a message the same way.
#pragma once

#include <nlohmann/json.hpp>

#include "util/field_key.h"

// nlohmann's variadic paste (what its NLOHMANN_DEFINE_TYPE_* macros use) applies VIT_VISIT_ONE to each name.
#define VIT_VISIT_ONE(field) visitor(#field, fields.field);
#define VIT_VISIT_FIELDS(visitor_arg, struct_arg, ...)                     \
  do {                                                                    \
    auto&& visitor = visitor_arg;                                         \
    auto& fields = struct_arg;                                            \
    NLOHMANN_JSON_EXPAND(NLOHMANN_JSON_PASTE(VIT_VISIT_ONE, __VA_ARGS__)) \
  } while (false)
