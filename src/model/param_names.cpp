// Rules over the model's parameter names: weight decay, layer numbers, prefixes (model/param_names.h).
#include "model/param_names.h"

#include <stdexcept>

namespace vit {
namespace {

bool name_starts_with(const std::string& text, const std::string& prefix) {
  return text.size() >= prefix.size() && text.compare(0, prefix.size(), prefix) == 0;
}

// "blocks.1" matches blocks.1 and blocks.1.*, never blocks.10.
bool component_prefix(const std::string& name, const std::string& prefix) {
  if (!name_starts_with(name, prefix)) return false;
  return name.size() == prefix.size() || prefix.back() == '.' || name[prefix.size()] == '.';
}

}  // namespace

bool no_weight_decay(const std::string& name, const at::Tensor& parameter) {
  if (parameter.dim() <= 1) return true;
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  // timm's VisionTransformer.no_weight_decay(): pos_embed, cls_token, reg_token (and the relative bias table); Eva's
  // adds the mixed rotary frequencies.
  return ends_with("pos_embed") || ends_with("cls_token") || ends_with("reg_token") ||
         ends_with("relative_position_bias_table") || name == "rope.freqs";
}

int64_t layer_of(const std::string& name, int64_t depth) {
  for (const char* stem : {"patch_embed", "cls_token", "reg_token", "pos_embed", "norm_pre"}) {
    if (component_prefix(name, stem)) return 0;
  }
  if (name_starts_with(name, "blocks.")) {
    const size_t end = name.find('.', 7);
    const std::string index = name.substr(7, end == std::string::npos ? std::string::npos : end - 7);
    if (!index.empty() && index.find_first_not_of("0123456789") == std::string::npos && index.size() < 10) {
      const int64_t block = std::stoll(index);
      if (block < depth) return block + 1;
    }
    throw std::invalid_argument("layer_of: " + name + " is not a block of a " + std::to_string(depth) +
                                "-block model");
  }
  return depth + 1;
}

bool parameter_in(const std::string& name, const std::string& prefix) {
  return prefix == "backbone" ? !component_prefix(name, "head") : component_prefix(name, prefix);
}

}  // namespace vit
