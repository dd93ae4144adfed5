#include "runtime/serve/json_fields.h"

#include <fmt/format.h>

namespace choreo::serve {

using nlohmann::json;

ApiError bad(const std::string& param, const std::string& message, const std::string& code) {
  return ApiError(400, "invalid_request_error", code, message, param);
}

std::string json_type(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "a list";
  return "an object";
}

const json* field(const json& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

double number(const json& body, const char* name, double lo, double hi, double fallback,
              const std::string& param) {
  const std::string p = param.empty() ? name : param;
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_number())
    throw bad(p, fmt::format("'{}' must be a number, not {}", p, json_type(*v)), "invalid_type");
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi))
    throw bad(p, fmt::format("'{}' must be between {} and {}; got {}", p, lo, hi, x));
  return x;
}

int64_t integer(const json& body, const char* name, int64_t lo, int64_t hi, int64_t fallback,
                const std::string& param) {
  const std::string p = param.empty() ? name : param;
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_number_integer() && !v->is_number_unsigned())
    throw bad(p, fmt::format("'{}' must be an integer, not {}", p, json_type(*v)), "invalid_type");
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(hi))
    throw bad(p, fmt::format("'{}' must be at most {}", p, hi));
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) throw bad(p, fmt::format("'{}' must be between {} and {}; got {}", p, lo, hi, x));
  return x;
}

bool boolean(const json& body, const char* name, bool fallback, const std::string& param) {
  const std::string p = param.empty() ? name : param;
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_boolean())
    throw bad(p, fmt::format("'{}' must be true or false, not {}", p, json_type(*v)), "invalid_type");
  return v->get<bool>();
}

std::string text(const json& body, const char* name, bool required, const std::string& param) {
  const std::string p = param.empty() ? name : param;
  const json* v = field(body, name);
  if (!v) {
    if (required) throw bad(p, fmt::format("'{}' is required", p), "missing_required_parameter");
    return {};
  }
  if (!v->is_string())
    throw bad(p, fmt::format("'{}' must be a string, not {}", p, json_type(*v)), "invalid_type");
  return v->get<std::string>();
}

}  // namespace choreo::serve
