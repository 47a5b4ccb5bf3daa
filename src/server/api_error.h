#pragma once
// An error a client caused or must see, carried to the HTTP layer and rendered in OpenAI's format:
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
// The SDKs map the status to exception types (400 BadRequestError, 401 AuthenticationError, 404 NotFoundError,
// 429 RateLimitError), so the status matters as much as the body.
#include <stdexcept>
#include <string>

namespace dsv4::server {

struct ApiError : std::runtime_error {
  int status;
  std::string type;   // invalid_request_error | authentication_error | rate_limit_error | server_error ...
  std::string param;  // offending field, or empty (rendered as null)
  std::string code;   // machine-readable code, or empty (rendered as null)
  ApiError(int status_, std::string message, std::string type_ = "invalid_request_error", std::string param_ = "",
           std::string code_ = "")
      : std::runtime_error(std::move(message)),
        status(status_),
        type(std::move(type_)),
        param(std::move(param_)),
        code(std::move(code_)) {}
};

// A 400 about one request field.
[[noreturn]] inline void bad_param(const std::string& param, const std::string& message) {
  throw ApiError(400, message, "invalid_request_error", param);
}

// The JSON body for an error (compact, invalid UTF-8 in the message replaced).
std::string error_body(const ApiError& e);

}  // namespace dsv4::server
