// The per-epoch training history and its text forms (JSON for the resume state, CSV for summary.csv).
#include "train/history.h"

#include <cmath>
#include <iomanip>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "util/fields.h"

namespace vit {
using nlohmann::json;

namespace {

// The record's number fields, in summary.csv's column order: the one list JSON and CSV are made from.
template <typename Record, typename Visit>
void visit_numbers(Record& r, Visit&& visit) {
  VIT_VISIT_FIELDS(visit, r, train_loss, eval_loss, eval_top1, eval_top5, lr, epoch_seconds, img_per_s);
}

}  // namespace

json to_json(const EpochRecord& record) {
  json j{{"epoch", record.epoch}};
  visit_numbers(record, [&](const char* key, double value) { j[key] = value; });  // NaN dumps as null
  return j;
}

EpochRecord epoch_record_from_json(const json& j) {
  EpochRecord record;
  if (!j.is_object()) throw std::runtime_error("is " + std::string(j.type_name()) + ", not an object");
  const auto epoch = j.find("epoch");
  if (epoch == j.end()) throw std::runtime_error("\"epoch\" is missing");
  if (!epoch->is_number_integer()) throw std::runtime_error("\"epoch\" is " + epoch->dump() + ", not an integer");
  record.epoch = epoch->get<int64_t>();
  visit_numbers(record, [&](const char* key, double& value) {
    const auto v = j.find(key);
    if (v == j.end()) throw std::runtime_error("\"" + std::string(key) + "\" is missing");
    if (!v->is_number() && !v->is_null()) {
      throw std::runtime_error("\"" + std::string(key) + "\" is " + v->dump() + ", not a number");
    }
    value = v->is_number() ? v->get<double>() : std::nan("");  // null: NaN (JSON has none)
  });
  return record;
}

std::string csv_number(double v) {
  if (!std::isfinite(v)) return "";
  std::ostringstream s;
  s << std::setprecision(8) << v;
  return s.str();
}

std::string summary_csv(const std::vector<EpochRecord>& history) {
  std::string text = "epoch";
  const EpochRecord columns;
  visit_numbers(columns, [&](const char* key, double) { (text += ',') += key; });
  text += "\n";
  for (const auto& r : history) {
    text += std::to_string(r.epoch);
    // Appended: GCC 12 in C++20 mode warns falsely (-Wstringop-overflow) on "," + std::string&&.
    visit_numbers(r, [&](const char*, double value) { (text += ',') += csv_number(value); });
    text += "\n";
  }
  return text;
}

std::vector<CurvePanel> history_curves(const std::vector<EpochRecord>& history) {
  CurvePanel loss, accuracy;  // x: epochs
  loss.title = "loss";
  loss.curves = {{"train loss", {}}, {"eval loss", {}}};
  accuracy.title = "accuracy";
  accuracy.curves = {{"eval top-1 %", {}}, {"eval top-5 %", {}}};
  for (const auto& r : history) {
    loss.curves[0].values.push_back(r.train_loss);
    loss.curves[1].values.push_back(r.eval_loss);
    accuracy.curves[0].values.push_back(r.eval_top1);
    accuracy.curves[1].values.push_back(r.eval_top5);
  }
  return {loss, accuracy};
}

}  // namespace vit
