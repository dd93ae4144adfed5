// GGUF metadata: value type names, rendering of values, and the typed getters of File.

#include <fmt/format.h>

#include <limits>

#include "common/error.h"
#include "runtime/model/gguf.h"

namespace choreo::gguf {

bool is_integer_type(ValueType t) {
  switch (t) {
    case ValueType::UINT8:
    case ValueType::INT8:
    case ValueType::UINT16:
    case ValueType::INT16:
    case ValueType::UINT32:
    case ValueType::INT32:
    case ValueType::UINT64:
    case ValueType::INT64:
      return true;
    default:
      return false;
  }
}

bool is_float_type(ValueType t) { return t == ValueType::FLOAT32 || t == ValueType::FLOAT64; }

std::string_view value_type_name(ValueType t) {
  switch (t) {
    case ValueType::UINT8:
      return "uint8";
    case ValueType::INT8:
      return "int8";
    case ValueType::UINT16:
      return "uint16";
    case ValueType::INT16:
      return "int16";
    case ValueType::UINT32:
      return "uint32";
    case ValueType::INT32:
      return "int32";
    case ValueType::FLOAT32:
      return "float32";
    case ValueType::BOOL:
      return "bool";
    case ValueType::STRING:
      return "string";
    case ValueType::ARRAY:
      return "array";
    case ValueType::UINT64:
      return "uint64";
    case ValueType::INT64:
      return "int64";
    case ValueType::FLOAT64:
      return "float64";
  }
  return "unknown";
}

size_t Value::array_size() const {
  if (!is_array()) return 0;
  if (elem_type == ValueType::STRING) return strings.size();
  if (is_float_type(elem_type)) return floats.size();
  return ints.size();
}

namespace {

std::string quote(std::string_view s, size_t max_chars = 120) {
  std::string out = "\"";
  size_t n = 0;
  for (char c : s) {
    if (n++ == max_chars) {
      out += "...";
      break;
    }
    auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\x{:02x}", u);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string format_element(const Value& v, size_t i) {
  if (v.elem_type == ValueType::STRING) return quote(v.strings[i], 40);
  if (is_float_type(v.elem_type)) return fmt::format("{}", v.floats[i]);
  if (v.elem_type == ValueType::BOOL) return v.ints[i] ? "true" : "false";
  if (v.elem_type == ValueType::UINT64) return fmt::format("{}", static_cast<uint64_t>(v.ints[i]));
  return fmt::format("{}", v.ints[i]);
}

}  // namespace

std::string Value::to_string(size_t max_items) const {
  if (is_array()) {
    size_t n = array_size();
    std::string out = "[";
    for (size_t i = 0; i < n && i < max_items; ++i) {
      if (i) out += ", ";
      out += format_element(*this, i);
    }
    if (n > max_items) out += fmt::format(", ... ({} {} items)", n, value_type_name(elem_type));
    return out + "]";
  }
  if (const auto* s = std::get_if<std::string>(&scalar)) return quote(*s);
  if (const auto* b = std::get_if<bool>(&scalar)) return *b ? "true" : "false";
  if (const auto* d = std::get_if<double>(&scalar)) return fmt::format("{}", *d);
  if (const auto* u = std::get_if<uint64_t>(&scalar)) return fmt::format("{}", *u);
  return fmt::format("{}", std::get<int64_t>(scalar));
}

int64_t TensorInfo::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---- metadata access ---------------------------------------------------------------------------------

const Value* File::find(std::string_view key) const {
  auto it = kv_index_.find(std::string(key));
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const TensorInfo* File::tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

[[noreturn]] void wrong_type(const std::string& path, std::string_view key, const Value& v,
                             std::string_view expected) {
  std::string got = v.is_array() ? fmt::format("array of {}", value_type_name(v.elem_type))
                                 : std::string(value_type_name(v.type));
  throw InputError(fmt::format("{}: metadata key '{}' has type {}, expected {}", path, key, got, expected));
}

}  // namespace

int64_t File::get_int(std::string_view key, int64_t fallback) const {
  const Value* v = find(key);
  if (!v) return fallback;
  if (v->is_array() || !is_integer_type(v->type)) wrong_type(path_, key, *v, "an integer");
  if (const auto* u = std::get_if<uint64_t>(&v->scalar)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw InputError(fmt::format("{}: metadata key '{}' = {} is too large", path_, key, *u));
    }
    return static_cast<int64_t>(*u);
  }
  return std::get<int64_t>(v->scalar);
}

double File::get_float(std::string_view key, double fallback) const {
  const Value* v = find(key);
  if (!v) return fallback;
  if (v->is_array() || !(is_float_type(v->type) || is_integer_type(v->type)))
    wrong_type(path_, key, *v, "a number");
  if (const auto* d = std::get_if<double>(&v->scalar)) return *d;
  if (const auto* u = std::get_if<uint64_t>(&v->scalar)) return static_cast<double>(*u);
  return static_cast<double>(std::get<int64_t>(v->scalar));
}

bool File::get_bool(std::string_view key, bool fallback) const {
  const Value* v = find(key);
  if (!v) return fallback;
  if (v->type != ValueType::BOOL) wrong_type(path_, key, *v, "a bool");
  return std::get<bool>(v->scalar);
}

std::string File::get_string(std::string_view key, std::string fallback) const {
  const Value* v = find(key);
  if (!v) return fallback;
  if (v->type != ValueType::STRING) wrong_type(path_, key, *v, "a string");
  return std::get<std::string>(v->scalar);
}

int64_t File::require_int(std::string_view key) const {
  if (!has(key)) throw InputError(fmt::format("{}: required metadata key '{}' is missing", path_, key));
  return get_int(key, 0);
}

std::string File::require_string(std::string_view key) const {
  if (!has(key)) throw InputError(fmt::format("{}: required metadata key '{}' is missing", path_, key));
  return get_string(key, {});
}

const std::vector<std::string>& File::get_string_array(std::string_view key) const {
  static const std::vector<std::string> kEmpty;
  const Value* v = find(key);
  if (!v) return kEmpty;
  if (!v->is_array() || v->elem_type != ValueType::STRING) wrong_type(path_, key, *v, "an array of strings");
  return v->strings;
}

const std::vector<double>& File::get_float_array(std::string_view key) const {
  static const std::vector<double> kEmpty;
  const Value* v = find(key);
  if (!v) return kEmpty;
  if (!v->is_array() || !is_float_type(v->elem_type)) wrong_type(path_, key, *v, "an array of floats");
  return v->floats;
}

const std::vector<int64_t>& File::get_int_array(std::string_view key) const {
  static const std::vector<int64_t> kEmpty;
  const Value* v = find(key);
  if (!v) return kEmpty;
  if (!v->is_array() || !(is_integer_type(v->elem_type) || v->elem_type == ValueType::BOOL)) {
    wrong_type(path_, key, *v, "an array of integers");
  }
  return v->ints;
}

}  // namespace choreo::gguf
