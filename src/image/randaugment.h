// timm-style RandAugment on 8-bit images (1 or 3 channels) with OpenCV, as a RawAugment for the train transform.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/augment.h"

namespace vit {

// Identity, AutoContrast, Equalize, Rotate, Solarize, Color, Posterize, Contrast, Brightness, Sharpness, ShearX,
// ShearY, TranslateX, TranslateY (the translations are timm's TranslateXRel/YRel: a fraction of the image size).
const std::vector<std::string>& randaugment_op_names();

// Applies one op at `magnitude` (0..30; timm's scale: magnitude / 10 times the op's range, so 10 is timm's maximum
// and larger values extrapolate as timm does with a raised magnitude_max). `negate` flips the sign of the signed
// ops (Rotate, ShearX/Y, TranslateX/Y). Geometric ops fill with grey 128 and interpolate bilinearly.
void apply_randaugment_op(RawImage& image, const std::string& name, double magnitude, bool negate);

// timm's RandAugment: num_ops ops drawn with replacement, each applied with probability 0.5, signed ops negated
// with probability 0.5. Every draw comes from the given RNG, so a seed fixes the result.
RawAugment make_randaugment(int64_t num_ops, double magnitude);

}  // namespace vit
