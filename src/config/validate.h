// The checks of a config's values after parsing (config.cpp parses, validate.cpp checks). Each throws
// std::invalid_argument "<source>: <key>: <what>", naming the key through the field names (VIT_DATA_KEY, ...).
// validate(const ModelConfig&) is model_config.h's.
#pragma once

#include <string>

#include "config/config.h"

namespace vit {

// `section` is the key the preprocessing sits under ("data", or "preprocess" for a model file's metadata).
void validate_preprocess(const Preprocess& p, const std::string& source, const std::string& section);
void validate_augment(const AugmentConfig& a, const std::string& source);
void validate_data(const DataConfig& d, const std::string& source);
void validate_train(const TrainConfig& t, const std::string& source);
// Across sections: data.mean has one value, or one per model input channel.
void validate_channels(const Config& config, const std::string& source);

}  // namespace vit
