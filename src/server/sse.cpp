#include "server/sse.h"

namespace dsv4::server::sse {

std::string dump(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

std::string event(const nlohmann::json& payload) {
  // A compact dump never contains a raw newline (they are escaped inside strings), so one data line suffices.
  return "data: " + dump(payload) + "\n\n";
}

}  // namespace dsv4::server::sse
