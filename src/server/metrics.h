#pragma once
// Prometheus text-format metrics for `GET /metrics`. Counters and histograms are updated by the scheduler and the
// HTTP layer (thread-safe); gauges (queue depth, slots, KV usage) are read from a callback at render time so they
// can never drift from the scheduler's real state.
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace dsv4::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v);
  void render(const std::string& name, const std::string& help, std::string& out) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); last = +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

struct GaugeSnapshot {
  int64_t queue_depth = 0;
  int64_t active_requests = 0;
  int64_t slots_busy = 0;
  int64_t slots_total = 0;
  int64_t kv_tokens_active = 0;  // tokens held by sessions of running requests
  int64_t kv_tokens_cached = 0;  // tokens kept in idle slots for prefix reuse
  int64_t kv_tokens_capacity = 0;
};

class Metrics {
 public:
  Metrics();
  void request_finished(const std::string& endpoint, int status);  // one per HTTP request to an API endpoint
  void generation_finished(const std::string& finish_reason, int64_t prompt_tokens, int64_t prompt_cached,
                           int64_t completion_tokens);
  void observe_ttft(double s);
  void observe_inter_token(double s);
  // One batched decode forward: its sequences and its wall time (the forward only, sampling excluded).
  void observe_decode_batch(int64_t rows, double seconds);
  void set_gauges(std::function<GaugeSnapshot()> fn);
  std::string render() const;

 private:
  mutable std::mutex m_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<std::string, uint64_t> finished_;
  uint64_t prompt_tokens_ = 0, prompt_cached_ = 0, completion_tokens_ = 0;
  double decode_seconds_ = 0;
  Histogram ttft_, itl_, batch_;
  std::function<GaugeSnapshot()> gauges_;
};

}  // namespace dsv4::server
