// Logging through spdlog where the build has it (Debian), else a minimal stderr fallback (bare GPU machines).
#pragma once

#include <string>

namespace vit::log {

enum class Level { debug, info, warn, error };

void set_level(Level level);
// Prefix every line (e.g. "[rank 1] ") so interleaved multi-process logs stay readable.
void set_prefix(const std::string& prefix);
void debug(const std::string& message);
void info(const std::string& message);
void warn(const std::string& message);
void error(const std::string& message);

}  // namespace vit::log
