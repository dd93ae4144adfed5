#include "common/repair_policy.h"

#include <fmt/format.h>

#include <bit>
#include <charconv>
#include <cmath>

#include "common/error.h"

namespace choreo {

namespace {

constexpr uint64_t kFirstTag = uint64_t(1) << 56;
constexpr uint64_t kSelectTag = uint64_t(2) << 56;
constexpr uint64_t kValueBits = (uint64_t(1) << 56) - 1;

const char* const kPolicyHint =
    "give none, first:K (K >= 1 tokens, e.g. first:16) or select:R (0 < R <= 1, e.g. select:0.15)";

}  // namespace

std::string RepairPolicy::name() const {
  switch (kind) {
    case Kind::None:
      return "none";
    case Kind::First:
      return fmt::format("first:{}", first_tokens);
    case Kind::Select:
      return fmt::format("select:{}", select_fraction);
  }
  return "?";
}

uint64_t RepairPolicy::tag() const {
  switch (kind) {
    case Kind::None:
      return 0;
    case Kind::First:
      return kFirstTag | uint64_t(first_tokens);
    case Kind::Select:
      return kSelectTag | std::bit_cast<uint32_t>(select_fraction);
  }
  return 0;
}

RepairPolicy RepairPolicy::from_tag(uint64_t tag) {
  RepairPolicy p;
  const uint64_t value = tag & kValueBits;
  if ((tag & ~kValueBits) == kFirstTag) {
    p.kind = Kind::First;
    p.first_tokens = int(value);
  } else if ((tag & ~kValueBits) == kSelectTag) {
    p.kind = Kind::Select;
    p.select_fraction = std::bit_cast<float>(uint32_t(value));
  }
  return p;
}

RepairPolicy parse_repair_policy(std::string_view text) {
  RepairPolicy p;
  if (text == "none") return p;
  const size_t colon = text.find(':');
  const std::string_view kind = text.substr(0, colon);
  const std::string_view value =
      colon == std::string_view::npos ? std::string_view() : text.substr(colon + 1);
  const char* const end = value.data() + value.size();
  if (kind == "first" && colon != std::string_view::npos) {
    int64_t k = 0;
    const auto [at, ec] = std::from_chars(value.data(), end, k);
    if (ec != std::errc() || at != end || k < 1 || k > kMaxRepairFirstTokens)
      throw InputError(fmt::format("repair policy `{}`: K must be a whole number of tokens from 1 to {}",
                                   text, kMaxRepairFirstTokens),
                       kPolicyHint);
    p.kind = RepairPolicy::Kind::First;
    p.first_tokens = int(k);
    return p;
  }
  if (kind == "select" && colon != std::string_view::npos) {
    double r = 0;
    const auto [at, ec] = std::from_chars(value.data(), end, r);
    if (ec != std::errc() || at != end || !(r > 0.0) || r > 1.0 || float(r) <= 0.0f)
      throw InputError(fmt::format("repair policy `{}`: R must be a fraction above 0 and at most 1", text),
                       kPolicyHint);
    p.kind = RepairPolicy::Kind::Select;
    p.select_fraction = float(r);
    return p;
  }
  throw InputError(fmt::format("unknown repair policy `{}`", text), kPolicyHint);
}

}  // namespace choreo
