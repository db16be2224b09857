// The per-epoch training history: one record per epoch, as summary.csv, the resume state and curves.png hold it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "util/curves.h"

namespace vit {

struct EpochRecord {
  int64_t epoch = 0;          // 1-based, as timm's summary.csv
  double train_loss = 0.0;    // mean training loss over the epoch
  double eval_loss = 0.0;     // NaN in epochs without evaluation
  double eval_top1 = 0.0;     // percent
  double eval_top5 = 0.0;     // percent
  double lr = 0.0;            // learning rate at the end of the epoch
  double epoch_seconds = 0.0; // training wall time of the epoch (without evaluation)
  double img_per_s = 0.0;     // training throughput over all ranks
};

// JSON object with the record's fields (NaN becomes null), and back (null becomes NaN).
nlohmann::json to_json(const EpochRecord& record);
EpochRecord epoch_record_from_json(const nlohmann::json& object);

// A number as summary.csv writes it: 8 significant digits, "" for NaN or infinity.
std::string csv_number(double value);
// summary.csv's text: a header line, then one line per epoch.
std::string summary_csv(const std::vector<EpochRecord>& history);
// curves.png's panels: losses (train, eval) and accuracies (top-1, top-5) per epoch.
std::vector<CurvePanel> history_curves(const std::vector<EpochRecord>& history);

}  // namespace vit
