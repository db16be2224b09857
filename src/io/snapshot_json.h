// The pieces the timm and Hugging Face snapshot code shares (src/io/snapshot.cpp, snapshot_timm.cpp,
// snapshot_hf.cpp; nothing else includes this): JSON reading with errors that name the file and key, and each
// format's reader and writer, which snapshot.cpp's read_snapshot and snapshot_files dispatch to.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/snapshot.h"

namespace vit::snapshot_detail {
using nlohmann::json;

// Throws std::runtime_error "<file>: <what>".
[[noreturn]] void fail(const std::string& file, const std::string& what);
// Throws std::invalid_argument "<kind> format cannot represent <what>".
[[noreturn]] void refuse(SnapshotKind kind, const std::string& what);
// A JSON object from `path`; anything else fails naming it.
json read_json(const std::string& path);
std::string show(const json& value);
std::string num(double value);

// The value at `key` as T, or `fallback` when absent or null; a wrong type fails naming the key.
template <typename T>
T get_or(const json& doc, const std::string& key, const T& fallback, const std::string& file) {
  auto it = doc.find(key);
  if (it == doc.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    fail(file, key + ": " + show(*it) + " has the wrong type");
  }
}

// The resize filter of a PIL resample code (preprocessor_config.json) or a timm interpolation name.
Interpolation interpolation_from(const json& value, const std::string& file, const std::string& key);
// "3" -> 3 when it is a whole index below `count`, else -1.
int64_t class_index(const std::string& key, int64_t count);
// config/model_config.h's read_model_fields, failing as every other error of a snapshot's config.json does
// (std::runtime_error naming the file and key).
std::vector<std::string> read_fields(const json& object, const std::string& path, const std::string& file,
                                     const FieldSpelling& spelling, ModelConfig& m);
// `name` with `from` (an exact name, or a prefix ending in '.') replaced by `to`; "" when it does not match: how the
// formats' name tables are read, both ways.
std::string renamed(const std::string& name, const std::string& from, const std::string& to);
// Fails naming (up to 8 of) the tensors of a file that `layout` ("a Hugging Face ViT") has no place for.
[[noreturn]] void fail_unknown_tensors(const std::string& path, const std::string& layout,
                                       const std::vector<std::string>& names);
// A number or a non-empty list of numbers.
std::vector<double> numbers(const json& value, const std::string& file, const std::string& key);

// Each format's reader: from its config.json (already read) into s.model, s.preprocess, s.class_names, s.sources.
void read_timm(const json& config, Snapshot& s);
void read_hf(const json& config, Snapshot& s);         // model_type "vit", or "dinov3_vit" through read_hf_dinov3
void read_hf_dinov3(const json& config, Snapshot& s);  // snapshot_hf_dinov3.cpp
// A Hugging Face image processor's preprocessor_config.json as our preprocessing, for model m (snapshot_hf.cpp).
Preprocess read_hf_processor(const json& pre, const std::string& pre_file, const ModelConfig& m);
// Our tensor names for a DINOv3ViTModel's (transformers' layout), for model m; an unknown tensor fails listing it.
std::map<std::string, std::vector<std::string>> dinov3_names(const ModelConfig& m,
                                                             const std::vector<std::string>& theirs,
                                                             const std::string& path);
// Each format's JSON files for snapshot_files (which checks what both lack first).
std::map<std::string, json> timm_files(const ModelConfig& m, const Preprocess& p,
                                       const std::vector<std::string>& class_names);
std::map<std::string, json> hf_files(const ModelConfig& m, const Preprocess& p,
                                     const std::vector<std::string>& class_names);

}  // namespace vit::snapshot_detail
