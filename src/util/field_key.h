// One field's key in a message, spelled as the field lists (util/fields.h) spell it: the field's own name.
#pragma once

#include <string>

// "section.field" as a std::string: VIT_KEY(TrainConfig, "train", lr) is "train.lr" (the section may be any string).
// A renamed or removed field stops the message from compiling, as it changes the key the field list reads.
#define VIT_KEY(struct_type, section, field) \
  (static_cast<void>(sizeof(struct_type::field)), std::string(section) + "." #field)
