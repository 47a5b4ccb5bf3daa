#include "server/metrics.h"

#include <cstdio>

namespace dsv4::server {

namespace {
std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}
void line(std::string& out, const std::string& s) { out += s + "\n"; }
void scalar(std::string& out, const char* name, const char* type, const char* help, double v) {
  line(out, std::string("# HELP ") + name + " " + help);
  line(out, std::string("# TYPE ") + name + " " + type);
  line(out, std::string(name) + " " + num(v));
}
}  // namespace

Histogram::Histogram(std::vector<double> b) : bounds_(std::move(b)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(const std::string& name, const std::string& help, std::string& out) const {
  line(out, "# HELP " + name + " " + help);
  line(out, "# TYPE " + name + " histogram");
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    line(out, name + "_bucket{le=\"" + num(bounds_[i]) + "\"} " + std::to_string(cum));
  }
  line(out, name + "_bucket{le=\"+Inf\"} " + std::to_string(count_));
  line(out, name + "_sum " + num(sum_));
  line(out, name + "_count " + std::to_string(count_));
}

Metrics::Metrics()
    : ttft_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      itl_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}),
      batch_({1, 2, 4, 8, 16, 32, 64, 128, 256}) {}

void Metrics::request_finished(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> l(m_);
  ++requests_[{endpoint, status}];
}

void Metrics::generation_finished(const std::string& finish_reason, int64_t prompt, int64_t cached, int64_t completion) {
  std::lock_guard<std::mutex> l(m_);
  ++finished_[finish_reason];
  prompt_tokens_ += static_cast<uint64_t>(prompt);
  prompt_cached_ += static_cast<uint64_t>(cached);
  completion_tokens_ += static_cast<uint64_t>(completion);
}

void Metrics::observe_ttft(double s) {
  std::lock_guard<std::mutex> l(m_);
  ttft_.observe(s);
}

void Metrics::observe_inter_token(double s) {
  std::lock_guard<std::mutex> l(m_);
  itl_.observe(s);
}

void Metrics::observe_decode_batch(int64_t rows, double seconds) {
  std::lock_guard<std::mutex> l(m_);
  batch_.observe(static_cast<double>(rows));
  decode_seconds_ += seconds;
}

void Metrics::set_gauges(std::function<GaugeSnapshot()> fn) {
  std::lock_guard<std::mutex> l(m_);
  gauges_ = std::move(fn);
}

std::string Metrics::render() const {
  GaugeSnapshot g;
  std::function<GaugeSnapshot()> fn;
  {
    std::lock_guard<std::mutex> l(m_);
    fn = gauges_;
  }
  if (fn) g = fn();  // outside our lock: the callback takes the scheduler's lock
  std::lock_guard<std::mutex> l(m_);
  std::string out;
  line(out, "# HELP dsv4_http_requests_total HTTP requests to API endpoints by endpoint and status");
  line(out, "# TYPE dsv4_http_requests_total counter");
  for (const auto& [k, v] : requests_)
    line(out, "dsv4_http_requests_total{endpoint=\"" + k.first + "\",status=\"" + std::to_string(k.second) + "\"} " +
                  std::to_string(v));
  line(out, "# HELP dsv4_generations_total finished generations by finish reason (cancelled = client gone)");
  line(out, "# TYPE dsv4_generations_total counter");
  for (const char* r : {"stop", "length", "cancelled", "error"}) {
    auto it = finished_.find(r);
    line(out, std::string("dsv4_generations_total{finish_reason=\"") + r + "\"} " +
                  std::to_string(it == finished_.end() ? 0 : it->second));
  }
  scalar(out, "dsv4_prompt_tokens_total", "counter", "prompt tokens of finished generations", prompt_tokens_);
  scalar(out, "dsv4_prompt_tokens_cached_total", "counter", "prompt tokens reused from a slot's prefix", prompt_cached_);
  scalar(out, "dsv4_generation_tokens_total", "counter", "completion tokens generated", completion_tokens_);
  ttft_.render("dsv4_time_to_first_token_seconds", "submit to first token, queueing included", out);
  itl_.render("dsv4_inter_token_latency_seconds", "time between consecutive tokens of one request", out);
  batch_.render("dsv4_decode_batch_size", "sequences per batched decode forward", out);
  scalar(out, "dsv4_decode_forward_seconds_total", "counter",
         "wall time of the batched decode forwards (over dsv4_decode_batch_size_sum: seconds per decoded row)",
         decode_seconds_);
  scalar(out, "dsv4_queue_depth", "gauge", "requests waiting for a slot", g.queue_depth);
  scalar(out, "dsv4_active_requests", "gauge", "requests holding a slot", g.active_requests);
  scalar(out, "dsv4_slots_busy", "gauge", "slots (sessions) in use", g.slots_busy);
  scalar(out, "dsv4_slots_total", "gauge", "slots (--max-batch)", g.slots_total);
  scalar(out, "dsv4_kv_tokens_active", "gauge", "context tokens held by running requests", g.kv_tokens_active);
  scalar(out, "dsv4_kv_tokens_cached", "gauge", "context tokens kept in idle slots for prefix reuse", g.kv_tokens_cached);
  scalar(out, "dsv4_kv_tokens_capacity", "gauge", "slots x max context", g.kv_tokens_capacity);
  const double used = g.kv_tokens_capacity ? static_cast<double>(g.kv_tokens_active) / g.kv_tokens_capacity : 0;
  scalar(out, "dsv4_kv_usage_ratio", "gauge", "active context tokens / capacity", used);
  return out;
}

}  // namespace dsv4::server
