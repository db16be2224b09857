// The counters and histograms `vit serve` exposes at GET /metrics, in Prometheus' text format (version 0.0.4).
// Thread-safe; std only.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace vit {

// A Prometheus histogram: counts per upper bound (cumulative when written), their sum and count.
struct Histogram {
  std::vector<double> bounds;   // ascending upper bounds; +Inf is implicit
  std::vector<uint64_t> counts;  // per bucket, not cumulative; one more than bounds (the +Inf bucket)
  double sum = 0;
  uint64_t count = 0;

  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
};

class ServeMetrics {
 public:
  ServeMetrics();

  // A request answered: its endpoint (one of the server's paths, or "other"), HTTP status and seconds from its
  // first byte read to its answer written.
  void request(const std::string& endpoint, int status, double seconds);
  // A batch run: its images and seconds.
  void batch(int64_t images, double seconds);
  // One image decoded and preprocessed, in seconds.
  void decode(double seconds);

  // Everything, with the queue depth (requests in flight) and readiness as gauges at this moment.
  std::string prometheus(int64_t in_flight, bool ready) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;  // (endpoint, status) -> count
  std::map<std::string, Histogram> latency_;                   // per endpoint
  Histogram batch_images_;
  Histogram batch_seconds_;
  Histogram decode_seconds_;
  uint64_t images_ = 0;
  // (time, images) of the batches of the last kRateWindow, for images/s.
  std::deque<std::pair<std::chrono::steady_clock::time_point, int64_t>> recent_;
  std::chrono::steady_clock::time_point started_;
};

}  // namespace vit
