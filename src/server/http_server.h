#pragma once
// The HTTP front end: routes, API-key check, request logging, and the bridge between an HTTP connection thread and
// the scheduler (a response is streamed from the request's event queue; a failed write means the client is gone
// and cancels the request, which frees its slot).
#include <memory>
#include <string>

#include "server/metrics.h"
#include "server/scheduler.h"
#include "text/tokenizer.h"

namespace httplib {
class Server;
}

namespace dsv4::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0 = any free port
  std::string api_key;  // empty = no authentication
  std::string served_model_name = "deepseek-v4";
  bool test_hooks = false;  // see ParseContext::test_hooks
  size_t max_body_bytes = 8u << 20;
  int http_threads = 32;
  bool log_requests = true;
};

class HttpServer {
 public:
  HttpServer(Scheduler& sched, const text::Tokenizer& tok, Metrics& metrics, ServerOptions opts);
  ~HttpServer();
  int bind();   // binds host:port, returns the port; throws dsv4::Error on failure
  void run();   // serves until stop()
  void stop();  // any thread

 private:
  void routes();
  Scheduler& sched_;
  const text::Tokenizer& tok_;
  Metrics& metrics_;
  ServerOptions opts_;
  std::unique_ptr<httplib::Server> svr_;
  int listen_fd_ = -1;  // the listening socket, captured from httplib's socket-options hook (see bind())
};

}  // namespace dsv4::server
