// Precompiled header: torch/torch.h alone costs ~30 s per translation unit, so every target reuses this one.
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>
