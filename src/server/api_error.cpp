#include "server/api_error.h"

#include <nlohmann/json.hpp>

namespace dsv4::server {

std::string error_body(const ApiError& e) {
  using nlohmann::json;
  json err = {{"message", e.what()},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
  return json{{"error", err}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace dsv4::server
