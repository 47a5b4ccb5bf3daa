#include "server/http_server.h"

#include <httplib.h>

#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <random>

#include "core/error.h"
#include "server/api_error.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/sse.h"

namespace dsv4::server {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kListenBacklog = 1024;  // the kernel caps it at net.core.somaxconn

// Per-connection-thread request bookkeeping for the one log line (httplib runs routing, the content provider and
// the logger of one request on the same thread).
thread_local Clock::time_point t_start;
thread_local std::string t_note;

std::string random_hex(size_t n) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) s += hex[rng() & 15];
  return s;
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(error_body(e), "application/json");
}

std::string endpoint_label(const std::string& path) {
  for (const char* p : {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"})
    if (path == p) return p;
  return "other";
}

// State shared by one streamed response's content provider and its releaser.
struct Pending {
  std::shared_ptr<RequestHandle> handle;
  ResponseBuilder builder;
  bool stream;
  bool started = false;
  Pending(std::shared_ptr<RequestHandle> h, ResponseBuilder b, bool s)
      : handle(std::move(h)), builder(std::move(b)), stream(s) {}
};

std::string summary(const GenerationResult& r) {
  char b[200];
  std::snprintf(b, sizeof b, " prompt=%lld cached=%lld completion=%lld finish=%s ttft=%.3fs",
                (long long)r.timings.prompt_tokens, (long long)(r.timings.prompt_tokens - r.timings.prompt_computed),
                (long long)r.timings.generated_tokens, r.finish_reason.c_str(), r.timings.ttft_s);
  return b;
}

}  // namespace

HttpServer::HttpServer(Scheduler& sched, const text::Tokenizer& tok, Metrics& metrics, ServerOptions opts)
    : sched_(sched), tok_(tok), metrics_(metrics), opts_(std::move(opts)), svr_(std::make_unique<httplib::Server>()) {
  routes();
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  // httplib (0.11, Debian's shared library) listens with a backlog of 5 and sets SO_REUSEPORT. A backlog of 5 drops
  // the SYNs of clients that connect at once (16 agents starting together: measured 33 drops, each retried by the
  // client only after 1-3 s), and SO_REUSEPORT lets a second server bind a port that is already serving. The hook
  // below replaces the socket options (SO_REUSEADDR only: restart without waiting for TIME_WAIT) and keeps the fd, so
  // that the backlog can be raised after httplib's listen() -- calling listen() again on Linux updates it.
  svr_->set_socket_options([this](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd_ = static_cast<int>(sock);
  });
  int port = opts_.port == 0 ? svr_->bind_to_any_port(opts_.host) : (svr_->bind_to_port(opts_.host, opts_.port) ? opts_.port : -1);
  if (port <= 0) fail("cannot listen on ", opts_.host, ":", opts_.port, " (in use, or not an address of this host)");
  if (listen_fd_ >= 0 && ::listen(listen_fd_, kListenBacklog) != 0)
    fail("cannot raise the listen backlog of ", opts_.host, ":", port, ": ", std::strerror(errno));
  return port;
}

void HttpServer::run() { svr_->listen_after_bind(); }
void HttpServer::stop() { svr_->stop(); }

void HttpServer::routes() {
  httplib::Server& s = *svr_;
  const int threads = opts_.http_threads;
  s.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  s.set_payload_max_length(opts_.max_body_bytes);
  s.set_read_timeout(30, 0);
  // Clients that keep a connection open (agents, SDKs) may send many requests on it (httplib's default closes it
  // after 5); an idle connection is still closed after the keep-alive timeout.
  s.set_keep_alive_max_count(1000);
  s.set_pre_routing_handler([](const httplib::Request&, httplib::Response&) {
    t_start = Clock::now();
    t_note.clear();
    return httplib::Server::HandlerResponse::Unhandled;
  });
  s.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    const std::string ep = endpoint_label(req.path);
    if (ep != "/metrics" && ep != "/health") metrics_.request_finished(ep, res.status);
    if (opts_.log_requests) {
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t_start).count();
      std::fprintf(stderr, "[dsv4 serve] %s %s %s %d %.1fms%s\n", req.remote_addr.c_str(), req.method.c_str(),
                   req.path.c_str(), res.status, ms, t_note.c_str());
    }
  });
  // Routing misses (404/405) and httplib's own rejections (413, 400) get an OpenAI-format body too.
  s.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string type = res.status == 404 ? "not_found_error" : "invalid_request_error";
    const char* what = res.status == 404   ? "no such endpoint"
                       : res.status == 405 ? "method not allowed"
                       : res.status == 413 ? "request body too large"
                                           : "bad request";
    res.set_content(error_body(ApiError(res.status, "HTTP " + std::to_string(res.status) + ": " + what, type)),
                    "application/json");
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, ApiError(500, what, "server_error"));
  });

  auto authorized = [this](const httplib::Request& req) {
    if (opts_.api_key.empty()) return true;
    const std::string want = "Bearer " + opts_.api_key;
    const std::string got = req.get_header_value("Authorization");
    unsigned diff = got.size() != want.size();  // compare every byte: no early exit on the first mismatch
    for (size_t i = 0; i < want.size(); ++i) diff |= static_cast<unsigned>(i < got.size() ? got[i] ^ want[i] : 1);
    return diff == 0;
  };
  auto guard = [this, authorized](auto fn) {
    return [this, authorized, fn](const httplib::Request& req, httplib::Response& res) {
      try {
        if (!authorized(req))
          throw ApiError(401, "Incorrect API key provided", "authentication_error", "", "invalid_api_key");
        fn(req, res);
      } catch (const ApiError& e) {
        t_note = std::string(" error=\"") + e.what() + "\"";
        send_error(res, e);
      }
    };
  };

  s.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{\"status\":\"ok\"}", "application/json");
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.render(), "text/plain; version=0.0.4");
  });
  s.Get("/v1/models", guard([this](const httplib::Request&, httplib::Response& res) {
          json m = {{"id", opts_.served_model_name}, {"object", "model"}, {"created", static_cast<int64_t>(std::time(nullptr))},
                    {"owned_by", "dsv4"}, {"max_model_len", sched_.max_context()}};
          res.set_content(sse::dump({{"object", "list"}, {"data", json::array({m})}}), "application/json");
        }));

  auto generate = [this](const httplib::Request& req, httplib::Response& res, bool chat) {
    ParseContext ctx{tok_, sched_.max_context(), opts_.served_model_name, opts_.test_hooks};
    ApiRequest ar = chat ? parse_chat_request_body(req.body, ctx) : parse_completion_request_body(req.body, ctx);
    std::shared_ptr<RequestHandle> h;
    try {
      h = sched_.submit(ar.gen);
    } catch (const QueueFull& e) {
      throw ApiError(429, e.what(), "rate_limit_error", "", "queue_full");
    } catch (const std::exception& e) {
      throw ApiError(400, e.what());
    }
    const std::string id = (chat ? "chatcmpl-" : "cmpl-") + random_hex(24);
    auto p = std::make_shared<Pending>(h, ResponseBuilder(ar, tok_, id, static_cast<int64_t>(std::time(nullptr))), ar.stream);
    // Both kinds of response are written by a chunked provider, so that a write failure (client gone) is noticed
    // while generating: streams write every token, non-streaming responses send JSON-insignificant whitespace as a
    // heartbeat while waiting.
    auto provider = [p](size_t, httplib::DataSink& sink) {
      auto write = [&](const std::string& out) {
        if (out.empty() || sink.write(out.data(), out.size())) return true;
        p->handle->cancel();
        return false;
      };
      if (!p->started) {
        p->started = true;
        if (p->stream && !write(p->builder.stream_begin())) return false;
      }
      RequestEvent ev;
      if (!p->handle->next(ev, std::chrono::milliseconds(500)))
        return write(p->stream ? sse::heartbeat() : std::string(" "));
      std::string out;
      bool last = false;
      // Send every event that is already waiting in one write.
      do {
        last = ev.kind != RequestEvent::Kind::Token;
        if (p->stream) {
          out += p->builder.stream_event(ev);
        } else if (ev.kind == RequestEvent::Kind::Done) {
          out += sse::dump(p->builder.complete(ev.result));
        } else if (ev.kind == RequestEvent::Kind::Error) {
          out += error_body(ApiError(500, ev.error, "server_error"));
        }
        if (last) {
          if (ev.kind == RequestEvent::Kind::Done) t_note = summary(ev.result);
          else t_note = " error=\"" + ev.error + "\"";
        }
      } while (!last && p->handle->next(ev, std::chrono::milliseconds(0)));
      if (!write(out)) return false;
      if (last) sink.done();
      return true;
    };
    auto releaser = [p](bool success) {
      if (!success) {
        p->handle->cancel();
        t_note += " client-disconnected";
      }
    };
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(ar.stream ? "text/event-stream" : "application/json", provider, releaser);
  };
  s.Post("/v1/chat/completions", guard([generate](const httplib::Request& q, httplib::Response& r) { generate(q, r, true); }));
  s.Post("/v1/completions", guard([generate](const httplib::Request& q, httplib::Response& r) { generate(q, r, false); }));
}

}  // namespace dsv4::server
