// Typed configuration for `vit`: the JSON sections `model`, `data`, `train`, parsed once at the boundary.
// Every default is documented beside its field; unknown keys, wrong types and bad values fail with the JSON path.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "config/enum_names.h"
#include "config/model_config.h"
#include "util/field_key.h"

namespace vit {

enum class Interpolation { bilinear, bicubic };
VIT_ENUM_NAMES(Interpolation, "bilinear", "bicubic");
// Evaluation resize before the centre crop, as timm's crop_mode: center keeps the aspect ratio (shorter side to
// size / crop_pct); squash resizes both sides to size / crop_pct (Hugging Face's ViTImageProcessor, timm's 384 models).
enum class CropMode { center, squash };
VIT_ENUM_NAMES(CropMode, "center", "squash");
// Where a centre crop with an odd margin puts its extra pixel: round as torchvision's center_crop does (timm; Python's
// round of margin / 2, ties to even), or floor as transformers' image processors do (margin // 2). They differ when
// the margin is 3 mod 4.
enum class CropOffset { round, floor };
VIT_ENUM_NAMES(CropOffset, "round", "floor");
enum class DataFormat { folder, csv, mnist, fashion_mnist, cifar10, cifar100, wds };
VIT_ENUM_NAMES(DataFormat, "folder", "csv", "mnist", "fashion_mnist", "cifar10", "cifar100", "wds");
// What a dataset image that cannot be decoded does: stop the run, or leave it out (and list it at the end).
enum class BadImagePolicy { fail, skip };
VIT_ENUM_NAMES(BadImagePolicy, "fail", "skip");
// Mixed precision: float32, bfloat16 (CUDA autocast; on the CPU the fused blocks' products), float16 autocast with
// loss scaling (CUDA), or auto: bf16 where it is the faster choice (CUDA; a CPU with AMX), float32 elsewhere
// (resolve_amp, train/trainer.h).
enum class AmpMode { off, bf16, fp16, automatic };
VIT_ENUM_NAMES(AmpMode, "off", "bf16", "fp16", "auto");
// Which weights a model file holds: the trained parameters or their EMA. train.final_weights declares, before
// training, which of them is the run's result (final.safetensors): the test set is scored on these once, never on a
// checkpoint picked by looking at evaluation results.
enum class Weights { model, ema };
VIT_ENUM_NAMES(Weights, "model", "ema");
// The c10d backend of multi-process training; automatic: NCCL on CUDA, Gloo on the CPU.
enum class DistBackend { automatic, gloo, nccl };
VIT_ENUM_NAMES(DistBackend, "auto", "gloo", "nccl");

// The one preprocessing shared by train (evaluation part), evaluate, predict and export-attention.
struct Preprocess {
  std::vector<double> mean = {0.5, 0.5, 0.5};  // per channel, on [0, 1] pixels
  std::vector<double> std = {0.5, 0.5, 0.5};   // per channel
  Interpolation interpolation = Interpolation::bicubic;  // resize filter (PIL's, as timm uses it)
  // Evaluation geometry, as timm's eval transform: resize to floor(size / crop_pct), then centre crop to the size.
  double crop_pct = 1.0;                  // fraction of the resized image the centre crop keeps, (0, 1]
  CropMode crop_mode = CropMode::center;  // center: keep the aspect ratio (shorter side); squash: both sides
  CropOffset crop_offset = CropOffset::round;  // round: timm's; floor: a Hugging Face processor's
  // Declared with the weights (model files carry it), so train's evaluations, `vit evaluate`, predict and serve all
  // score the same way; timm, Hugging Face and ONNX exports hold the plain model (vit export warns).
  bool eval_hflip = false;  // flip test-time augmentation: the mean of an image's and its mirror's logits
};

// The side a `size` crop is taken from: floor(size / crop_pct), as timm's eval transform computes it (with 1e-9 of
// slack, so that a crop_pct read as size / resized gives `resized` back).
int64_t eval_scale(int64_t size, double crop_pct);

// Training-time augmentation; everything off by default.
struct AugmentConfig {
  bool random_resized_crop = false;            // RandomResizedCrop to the model size
  std::array<double, 2> scale = {0.08, 1.0};   // area fraction range of the crop
  std::array<double, 2> ratio = {0.75, 4.0 / 3.0};  // aspect ratio range of the crop
  int64_t pad_crop = 0;        // pad by this many pixels and random-crop back (small-image alternative)
  double hflip = 0.0;          // probability of a horizontal flip
  int64_t randaugment_ops = 0;      // RandAugment: ops per image (0 = off)
  double randaugment_magnitude = 9; // RandAugment magnitude, 0..30
  double random_erasing = 0.0;  // probability of erasing one random rectangle
  double mixup_alpha = 0.0;     // Beta(alpha, alpha) for mixup (0 = off)
  double cutmix_alpha = 0.0;    // Beta(alpha, alpha) for cutmix (0 = off)
  double mix_prob = 1.0;        // probability a batch is mixed at all (when mixup or cutmix is on)
  double switch_prob = 0.5;     // with both on: probability of cutmix instead of mixup
};

struct DataConfig {
  Preprocess preprocess;        // keys mean/std/interpolation/crop_pct/crop_mode live directly under "data"
  DataFormat format = DataFormat::fashion_mnist;  // folder | csv | mnist | fashion_mnist | cifar10 | cifar100 | wds
  std::string root;             // dataset root (default for mnist-like: Debian's install location)
  std::string train_dir;        // folder: training root (default root/train, or root with val_fraction)
  std::string val_dir;          // folder: validation root (default root/val)
  std::string test_dir;         // folder: test root (default = val)
  std::string train_csv;        // csv: path,label list for training
  std::string val_csv;          // csv: list for validation
  std::string test_csv;         // csv: list for test (default = val)
  // wds: WebDataset tar shards, as a brace pattern ("train-{000000..000146}.tar"), several joined by "::", or a text
  // file listing one shard (or pattern) per line, relative to the file's folder.
  std::string train_shards;     // wds: training shards
  std::string val_shards;       // wds: validation shards
  std::string test_shards;      // wds: test shards (default = val)
  int64_t shuffle_buffer = 1000;  // wds: samples in the shuffle buffer after the per-epoch shard shuffle (<= 1 = off)
  std::string label_field = "label";  // wds: the .json member's field holding the label, for samples without .cls
  double val_fraction = 0.0;    // > 0: split the training set deterministically by seed
  int64_t train_subset = 0;     // > 0: use only the first N training samples (after shuffling by seed)
  int64_t val_subset = 0;       // > 0: evaluate on only the first N validation samples
  // Only these classes, in this order, relabelled 0..n-1 in every split: class names, or indices into the dataset's
  // class list (an entry that names a class is that class; else a number is an index). Empty = all classes.
  std::vector<std::string> classes;  // e.g. ["Sandal", "Shirt"] or [5, 6, 7, 8, 9]
  int64_t train_per_class = 0;  // > 0: keep at most N training samples per class (chosen by seed, after val_fraction)
  int64_t num_workers = 2;      // background decode/augment threads
  int64_t prefetch_batches = 4; // bounded queue length
  // Training on JPEGs with random_resized_crop (and no RandAugment): decode only the crop's window, at 1/2, 1/4 or
  // 1/8 scale when the crop stays at or above the model size (libjpeg's DCT scaling). Evaluation never does.
  bool reduced_decode = true;   // false: decode every training image whole, at full size
  BadImagePolicy on_bad_image = BadImagePolicy::fail;  // fail | skip
  AugmentConfig augment;
};

struct TrainConfig {
  int64_t epochs = 10;          // passes over the training set
  int64_t batch_size = 128;     // per-rank micro-batch
  int64_t accum_steps = 1;      // micro-batches per optimiser step
  double lr = 1e-3;             // peak learning rate
  double min_lr = 1e-5;         // cosine floor
  double warmup_lr = 1e-6;      // learning rate at step 0 of warmup
  int64_t warmup_steps = 0;     // warmup length in optimiser steps (wins over warmup_epochs when > 0)
  double warmup_epochs = 0.0;   // warmup length in epochs
  double weight_decay = 0.05;   // AdamW decoupled decay (not applied to 1-D params, pos_embed, cls_token)
  double beta1 = 0.9;           // AdamW beta1
  double beta2 = 0.999;         // AdamW beta2
  double eps = 1e-8;            // AdamW epsilon
  double clip_grad = 1.0;       // max global gradient norm (0 = no clipping)
  double label_smoothing = 0.1; // cross-entropy smoothing
  double ema_decay = 0.0;       // EMA of weights (0 = off), e.g. 0.9998
  Weights final_weights = Weights::model;  // model | ema (needs ema_decay): written as final.safetensors
  // Layer-wise lr decay (BEiT, timm's --layer-decay), e.g. 0.65-0.75 for fine-tuning; 1 = off. Each parameter's
  // lr is scaled by layer_decay^(depth + 1 - layer): patch_embed, cls_token, reg_token, pos_embed and norm_pre are
  // layer 0, block i is layer i + 1, the final norm, fc_norm, attn_pool and head are layer depth + 1 (scale 1).
  double layer_decay = 1.0;     // in (0, 1]
  // Parameter-name prefixes kept fixed: no gradient, no optimiser state, no weight decay, not clipped, not in the
  // EMA. A prefix matches whole name components ("blocks.1" is blocks.1.*, not blocks.10.*); "backbone" is every
  // parameter but head.* (a linear probe). A prefix that matches no parameter is an error.
  std::vector<std::string> freeze;  // e.g. ["backbone"] or ["patch_embed", "blocks.0"]
  std::string device = "auto";  // auto | cpu | cuda
  AmpMode amp = AmpMode::off;   // off | bf16 | fp16 on CUDA; off | bf16 on the CPU; auto (apply_amp, train/trainer.h)
  int64_t threads = 0;          // intra-op threads (0 = all cores)
  uint64_t seed = 42;           // seeds init, data order, augmentation, dropout
  int64_t log_interval = 50;    // optimiser steps between metrics.jsonl lines
  int64_t checkpoint_interval = 200;  // optimiser steps between resume states (0 = only per epoch)
  int64_t eval_interval = 1;    // epochs between evaluations
  int64_t max_steps = 0;        // > 0: stop after this many optimiser steps (tests, smoke runs)
  double target_top1 = 0.0;     // > 0: report the wall time when eval top-1 (validation split) first reaches it
  DistBackend dist_backend = DistBackend::automatic;  // auto | gloo | nccl (multi-process training)
  double dist_timeout_s = 180;  // seconds before a missing rank is an error
  std::string output_root = "runs";  // where run directories are created
};

// Config keys in messages ("data.val_fraction", ...), through the field names the field list reads them by.
#define VIT_DATA_KEY(field) VIT_KEY(::vit::DataConfig, "data", field)
#define VIT_AUGMENT_KEY(field) VIT_KEY(::vit::AugmentConfig, "data.augment", field)
#define VIT_PREPROCESS_KEY(field) VIT_KEY(::vit::Preprocess, "data", field)  // they sit directly under "data"
#define VIT_TRAIN_KEY(field) VIT_KEY(::vit::TrainConfig, "train", field)

struct Config {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
};


// Parses a whole config document. `source` names the file (or "--set") in error messages.
Config parse_config(const nlohmann::json& doc, const std::string& source);
// Reads a JSON file, applies `--set key=value` overrides in order, then parses.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Applies one `a.b.c=value` override; the value is JSON when it parses as JSON, else a string.
void apply_override(nlohmann::json& doc, const std::string& assignment);

// Parsers/serialisers for the preprocessing section (model files carry it beside the model config).
Preprocess parse_preprocess(const nlohmann::json& section, const std::string& source);
nlohmann::json to_json(const Preprocess& preprocess);
nlohmann::json to_json(const Config& config);

// Class names "0" .. "count-1", for datasets and model files that carry none.
std::vector<std::string> numbered_classes(int64_t count);

// Every key a config file may hold, as dotted paths ("model.depth", "data.augment.hflip", ...): the same list that
// parsing and to_json are made from.
std::vector<std::string> config_keys();

}  // namespace vit
