// The resume state file: its progress JSON and its format checks.
#include "train/run_state.h"

#include <stdexcept>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "util/fields.h"

namespace vit {
using nlohmann::json;

namespace {

// The progress fields other than the history, the one list both directions are made from.
template <typename State, typename Visit>
void visit_fields(State& s, Visit&& visit) {
  VIT_VISIT_FIELDS(visit, s, epoch, step_in_epoch, global_step, epoch_loss_sum, epoch_loss_count, epoch_seconds,
                   epoch_images, best_top1, elapsed_seconds, seconds_to_target, metrics_bytes, loss_scale, good_steps);
}

// Reads `key` into `out`, or throws naming the key: missing, or not a number of the field's kind.
template <typename T>
void read_number(const json& object, const std::string& key, T& out) {
  const auto it = object.find(key);
  if (it == object.end()) throw std::runtime_error("\"" + key + "\" is missing");
  const bool fits = std::is_floating_point_v<T> ? it->is_number()
                    : std::is_unsigned_v<T>     ? it->is_number_unsigned()
                                                : it->is_number_integer();
  if (!fits) {
    throw std::runtime_error("\"" + key + "\" is " + it->dump() + ", not " +
                             (std::is_floating_point_v<T> ? "a number" : "an integer"));
  }
  out = it->get<T>();
}

}  // namespace

json to_json(const RunState& s) {
  json j;
  visit_fields(s, [&](const char* key, const auto& value) { j[key] = value; });
  j["history"] = json::array();
  for (const auto& record : s.history) j["history"].push_back(to_json(record));
  return j;
}

RunState run_state_from_json(const json& j, const std::string& source) {
  RunState s;
  std::string where = "";
  try {
    if (!j.is_object()) throw std::runtime_error("is " + std::string(j.type_name()) + ", not an object");
    visit_fields(s, [&](const char* key, auto& value) {
      const bool renamed = std::string(key) == "seconds_to_target" && !j.contains(key) && j.contains("seconds_to_90");
      read_number(j, renamed ? "seconds_to_90" : key, value);
    });
    const auto history = j.find("history");
    if (history == j.end()) throw std::runtime_error("\"history\" is missing");
    if (!history->is_array()) throw std::runtime_error("\"history\" is " + history->dump() + ", not a list");
    for (size_t i = 0; i < history->size(); ++i) {
      where = "history[" + std::to_string(i) + "]: ";
      s.history.push_back(epoch_record_from_json((*history)[i]));
    }
  } catch (const std::exception& e) {
    throw std::runtime_error(source + ": training state: " + where + e.what() +
                             " (a damaged state file: resume from a copy, or start again with --init-from)");
  }
  return s;
}

void write_run_state(const std::string& path, const safetensors::NamedTensors& tensors, const RunState& state,
                     int world_size) {
  safetensors::write(path, tensors,
                     {{"format", kRunStateFormat},
                      {"format_version", std::to_string(kRunStateFormatVersion)},
                      {"state", to_json(state).dump()},
                      {"world_size", std::to_string(world_size)}});
}

torch::Tensor SavedRun::tensor(const std::string& name) const {
  const auto* info = archive.find(name);
  if (info == nullptr) throw std::runtime_error(archive.path + ": missing tensor " + name);
  return archive.tensor(*info, /*as_float32=*/false);
}

SavedRun read_run_state(const std::string& path) {
  SavedRun saved{safetensors::read(path), {}, 1};
  const auto& meta = saved.archive.metadata;
  auto value = [&](const std::string& key) {
    const auto it = meta.find(key);
    return it == meta.end() ? std::string() : it->second;
  };
  if (value("format") != kRunStateFormat) {
    throw std::runtime_error(path + ": not a vit training state (metadata format \"" + value("format") +
                             "\", expected \"" + kRunStateFormat + "\")");
  }
  const std::string version = value("format_version");
  if (version != std::to_string(kRunStateFormatVersion)) {
    throw std::runtime_error(path + ": training state format_version \"" + version + "\"; this vit reads version " +
                             std::to_string(kRunStateFormatVersion) +
                             " (resume it with the vit that wrote it, or start a new run with --init-from)");
  }
  if (!meta.count("state")) throw std::runtime_error(path + ": no \"state\" metadata");
  const json progress = json::parse(value("state"), nullptr, /*allow_exceptions=*/false);
  if (progress.is_discarded()) throw std::runtime_error(path + ": \"state\" metadata is not valid JSON");
  saved.state = run_state_from_json(progress, path);
  if (meta.count("world_size")) {
    try {
      saved.world_size = std::stoi(value("world_size"));
    } catch (const std::exception&) {
      throw std::runtime_error(path + ": world_size \"" + value("world_size") + "\" is not a number");
    }
  }
  return saved;
}

}  // namespace vit
