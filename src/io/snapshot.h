// Model snapshot folders as timm and Hugging Face transformers publish them on the Hub, read and written without
// Python: the architecture, preprocessing and class names come from their JSON files, the weights from their
// safetensors file (under their own tensor names: HF's separate q/k/v projections map onto our fused qkv).
//
// timm (`save_for_hf`): config.json {architecture, num_classes, model_args, pretrained_cfg, label_names} +
//   model.safetensors. Plain ViT names vit_{tiny,small,base,large,huge}_patch{P}_{size}[.tag] resolve to their
//   sizes; model_args override them; any model_args option our model lacks is refused by name.
// Hugging Face (`save_pretrained`): config.json {model_type "vit", sizes, layer_norm_eps, id2label} +
//   model.safetensors + preprocessor_config.json (ViTImageProcessor: resize straight to `size`, no crop; or
//   BitImageProcessor / CLIPImageProcessor: the shortest edge or both sides, then a centre crop).
// The shared part lives in snapshot.cpp, each format's reader and writer in snapshot_timm.cpp and snapshot_hf.cpp.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>
#include <torch/types.h>

#include "config/config.h"

namespace vit {

enum class SnapshotKind { timm, hf };
VIT_ENUM_NAMES(SnapshotKind, "timm", "hf");

// What a snapshot folder describes, and where each part came from (shown by `vit info`).
struct Snapshot {
  SnapshotKind kind = SnapshotKind::timm;
  std::string dir;
  std::string weights;  // dir/model.safetensors, or dir/model.safetensors.index.json when the weights are sharded
  std::map<std::string, std::string> shard_of;  // sharded weights: each tensor's file, from the index's weight_map
  ModelConfig model;
  Preprocess preprocess;
  std::vector<std::string> class_names;  // empty when the files name none
  std::vector<std::pair<std::string, std::string>> sources;  // ("model", "config.json: architecture ..."), ...
};

// True when `path` is a folder (a snapshot candidate); read_snapshot says what is wrong with it.
bool is_snapshot_dir(const std::string& path);

// Reads a timm or HF snapshot folder's JSON files and finds its weights. Throws std::runtime_error naming the file
// and the fault: no config.json, a pickle-only folder (never unpickled), a shard index that names no file in the
// folder, an architecture or option we lack (named), inconsistent sizes.
Snapshot read_snapshot(const std::string& dir);

// Refuses a pickle checkpoint (.bin/.pth/.pt/.ckpt, or a file that starts like one) with a one-line message that
// names it and says how to convert it to safetensors; does nothing for other files. It is never unpickled.
void refuse_pickle(const std::string& path);

// The snapshot's tensors by our (timm) names: our name -> the file's name, or HF's query, key and value (in that
// order) for a fused qkv. `model` is the snapshot's (an Eva one from Hugging Face is DINOv3ViTModel's layout). HF's
// pooler and mask token, which inference never reads, are left out; any other tensor that maps to nothing throws,
// listing them.
std::map<std::string, std::vector<std::string>> snapshot_names(SnapshotKind kind, const ModelConfig& model,
                                                               const std::vector<std::string>& theirs,
                                                               const std::string& path);

// The Hugging Face name of one of our tensors, the inverse of snapshot_names for a single name ("" for a fused qkv,
// which splits into three: hf_qkv_names).
std::string hf_name(const std::string& ours);
// HF's query, key and value names for blocks.N.attn.qkv.{weight,bias}.
std::vector<std::string> hf_qkv_names(const std::string& ours);

// The JSON files a snapshot of `kind` consists of, for a model with this preprocessing and these class names:
// {"config.json": ..., "preprocessor_config.json": ...}. Throws std::invalid_argument naming what the format cannot
// represent (no model file is written then).
std::map<std::string, nlohmann::json> snapshot_files(SnapshotKind kind, const ModelConfig& model,
                                                     const Preprocess& preprocess,
                                                     const std::vector<std::string>& class_names);

// The timm architecture name for a model (the plain ViT name its size matches, model_args carry the rest).
std::string timm_architecture(const ModelConfig& model);

}  // namespace vit
