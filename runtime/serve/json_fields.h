#pragma once
// Reading fields of a request body (nlohmann::json) with errors that name the field: ApiError 400 with the
// field in `param`, as the OpenAI SDKs show it. Shared by the API shapes (api.cc) and choreo's extensions
// (choreo_request.cc).

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "runtime/serve/request.h"

namespace choreo::serve {

/// A 400 invalid_request_error naming `param`.
ApiError bad(const std::string& param, const std::string& message, const std::string& code = "invalid_value");
/// "a string", "an integer", ... for messages.
std::string json_type(const nlohmann::json& v);
/// The field `name` of `body` when present and not null.
const nlohmann::json* field(const nlohmann::json& body, const char* name);
/// A number in [lo, hi], or `fallback` when absent. `param` names it in errors ("" : `name`).
double number(const nlohmann::json& body, const char* name, double lo, double hi, double fallback,
              const std::string& param = {});
int64_t integer(const nlohmann::json& body, const char* name, int64_t lo, int64_t hi, int64_t fallback,
                const std::string& param = {});
bool boolean(const nlohmann::json& body, const char* name, bool fallback, const std::string& param = {});
/// A string; "" when absent and not `required`.
std::string text(const nlohmann::json& body, const char* name, bool required, const std::string& param = {});

}  // namespace choreo::serve
