// Prometheus text for `vit serve`: requests by endpoint and status, latency, batch sizes, decode time, images/s.
#include "serve/metrics.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

namespace vit {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kRateWindow = std::chrono::seconds(10);

std::string number(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%.9g", value);
  return text;
}

void write_histogram(std::string& out, const std::string& name, const std::string& labels, const Histogram& h) {
  const std::string sep = labels.empty() ? "" : ",";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    cumulative += h.counts[i];
    out += name + "_bucket{" + labels + sep + "le=\"" + number(h.bounds[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  out += name + "_bucket{" + labels + sep + "le=\"+Inf\"} " + std::to_string(h.count) + "\n";
  const std::string braces = labels.empty() ? "" : "{" + labels + "}";
  out += name + "_sum" + braces + " " + number(h.sum) + "\n";
  out += name + "_count" + braces + " " + std::to_string(h.count) + "\n";
}

const std::vector<double> kLatencyBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                            0.25,  0.5,    1,     2.5,  5,     10,   30};

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds) : bounds(std::move(upper_bounds)), counts(bounds.size() + 1) {
  if (!std::is_sorted(bounds.begin(), bounds.end())) throw std::invalid_argument("histogram bounds must ascend");
}

void Histogram::observe(double value) {
  const size_t bucket = std::lower_bound(bounds.begin(), bounds.end(), value) - bounds.begin();  // le: value <= bound
  ++counts[bucket];
  sum += value;
  ++count;
}

ServeMetrics::ServeMetrics()
    : batch_images_({1, 2, 4, 8, 16, 32, 64, 128, 256}),
      batch_seconds_(kLatencyBounds),
      decode_seconds_({0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}),
      started_(Clock::now()) {}

void ServeMetrics::request(const std::string& endpoint, int status, double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++requests_[{endpoint, status}];
  latency_.try_emplace(endpoint, kLatencyBounds).first->second.observe(seconds);
}

void ServeMetrics::batch(int64_t images, double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  batch_images_.observe(static_cast<double>(images));
  batch_seconds_.observe(seconds);
  images_ += static_cast<uint64_t>(images);
  const auto now = Clock::now();
  recent_.emplace_back(now, images);
  while (!recent_.empty() && now - recent_.front().first > kRateWindow) recent_.pop_front();
}

void ServeMetrics::decode(double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  decode_seconds_.observe(seconds);
}

std::string ServeMetrics::prometheus(int64_t in_flight, bool ready) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = Clock::now();
  std::string out;
  out += "# HELP vit_requests_total Requests answered, by endpoint and HTTP status.\n";
  out += "# TYPE vit_requests_total counter\n";
  for (const auto& [key, count] : requests_) {
    out += "vit_requests_total{endpoint=\"" + key.first + "\",status=\"" + std::to_string(key.second) + "\"} " +
           std::to_string(count) + "\n";
  }
  out += "# HELP vit_request_duration_seconds Time from a request's arrival to its answer, by endpoint.\n";
  out += "# TYPE vit_request_duration_seconds histogram\n";
  for (const auto& [endpoint, histogram] : latency_) {
    write_histogram(out, "vit_request_duration_seconds", "endpoint=\"" + endpoint + "\"", histogram);
  }
  out += "# HELP vit_batch_images Images per forward pass.\n# TYPE vit_batch_images histogram\n";
  write_histogram(out, "vit_batch_images", "", batch_images_);
  out += "# HELP vit_batch_seconds Time of one forward pass.\n# TYPE vit_batch_seconds histogram\n";
  write_histogram(out, "vit_batch_seconds", "", batch_seconds_);
  out += "# HELP vit_decode_seconds Time to decode and preprocess one image.\n# TYPE vit_decode_seconds histogram\n";
  write_histogram(out, "vit_decode_seconds", "", decode_seconds_);
  out += "# HELP vit_images_total Images run through the model.\n# TYPE vit_images_total counter\n";
  out += "vit_images_total " + std::to_string(images_) + "\n";
  // Over the last 10 s (less just after start-up); Prometheus users may prefer rate(vit_images_total[1m]).
  int64_t recent_images = 0;
  for (const auto& [when, images] : recent_) {
    if (now - when <= kRateWindow) recent_images += images;
  }
  const double window = std::min(std::chrono::duration<double>(now - started_).count(),
                                 std::chrono::duration<double>(kRateWindow).count());
  out += "# HELP vit_images_per_second Images per second over the last 10 seconds.\n";
  out += "# TYPE vit_images_per_second gauge\n";
  out += "vit_images_per_second " + number(window > 0 ? static_cast<double>(recent_images) / window : 0.0) + "\n";
  out += "# HELP vit_queue_depth Requests admitted and not yet answered.\n# TYPE vit_queue_depth gauge\n";
  out += "vit_queue_depth " + std::to_string(in_flight) + "\n";
  out += "# HELP vit_ready Whether the model is loaded and warmed up.\n# TYPE vit_ready gauge\n";
  out += std::string("vit_ready ") + (ready ? "1" : "0") + "\n";
  return out;
}

}  // namespace vit
