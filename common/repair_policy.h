#pragma once
// How a call repairs the KV of cached parents that it reads away from their exact prefix position
// (docs/profile.md, "Repairing reused KV"): not at all, by recomputing the first k tokens of each such parent
// (EPIC), or by recomputing the fraction r of their tokens whose KV deviates most (CacheBlend). Below every
// layer that names a policy: the workflow language checks it, the engine runs it (runtime/engine/repair.cc).

#include <cstdint>
#include <string>
#include <string_view>

namespace choreo {

/// A repair policy: `none`, `first:K` or `select:R`.
struct RepairPolicy {
  enum class Kind { None, First, Select };
  Kind kind = Kind::None;
  int first_tokens = 0;       ///< first:K: tokens recomputed at the start of each parent read out of prefix
  float select_fraction = 0;  ///< select:R: the fraction of those parents' tokens recomputed, in (0, 1]

  bool none() const { return kind == Kind::None; }
  /// As parse_repair_policy reads it back: "none", "first:16", "select:0.15".
  std::string name() const;
  /// 0 for none, else a number that differs between any two policies (content keys mix it in, so an encoding
  /// made over repaired parents is never mistaken for one made without).
  uint64_t tag() const;
  /// The policy whose tag() is `tag`.
  static RepairPolicy from_tag(uint64_t tag);
  bool operator==(const RepairPolicy& other) const { return tag() == other.tag(); }
};

/// The largest K of first:K (far past any context).
constexpr int kMaxRepairFirstTokens = 1 << 28;

/// Parses `none`, `first:K` (a whole number K >= 1) or `select:R` (a number 0 < R <= 1). Throws InputError
/// (no location: callers add theirs) saying what was expected otherwise.
RepairPolicy parse_repair_policy(std::string_view text);

}  // namespace choreo
