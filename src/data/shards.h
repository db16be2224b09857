// WebDataset tar shards (data.format "wds"): samples are consecutive tar members sharing a key ("n01/x.jpg" and
// "n01/x.cls"), read front to back as a stream with libarchive, never extracted.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace vit {

struct ShardOptions {
  int64_t shuffle_buffer = 1000;      // samples held by the shuffle buffer (<= 1: arrival order)
  std::string label_field = "label";  // the .json member's field holding the label, for samples without .cls
};

// Brace expansion as webdataset's (Python braceexpand): "a-{000..012}.tar" counts with the width of the bounds when
// a bound has a leading zero, "{x,y}" lists; several groups multiply out, left to right.
std::vector<std::string> expand_braces(const std::string& pattern);

// The shards a spec names: brace patterns joined by "::", or a text file listing one shard or pattern per line
// (blank lines and lines starting with '#' ignored; relative paths are relative to the list's folder).
std::vector<std::string> expand_shard_spec(const std::string& spec);

// The order a shuffle buffer of `buffer` samples emits `arrivals` in: fill the buffer, then each arrival replaces a
// uniformly drawn entry, which is emitted; at the end the rest leave in uniformly drawn order. The sample emitted
// at position p arrived at position p + buffer - 1 or earlier. buffer <= 1 keeps the arrival order.
std::vector<int64_t> shuffle_buffer_order(const std::vector<int64_t>& arrivals, int64_t buffer, uint64_t seed);

// Opens the shards of `spec`, reading every shard's member headers (and its small label members) once: the sample
// count, each sample's image member and label. A tar that ends early, a sample without an image (.jpg .jpeg .png
// .webp) or without a label (.cls, or .json with options.label_field) fails here, naming the shard. Classes are
// "0".."K-1" for the largest label K-1 of the training shards; `train` (for val/test) supplies them instead.
// codec decodes the image members (get()); the loader passes them on encoded.
std::shared_ptr<const StreamDataset> open_shards(const std::string& spec, const ShardOptions& options,
                                                 std::shared_ptr<const ImageCodec> codec, const Dataset* train);

}  // namespace vit
