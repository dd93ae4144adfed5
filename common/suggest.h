#pragma once
// "Did you mean" suggestions for names a user mistyped, the one implementation every layer uses
// (dsl/ parser hints, expression and PML errors, `choreo exec` calls, eval options). The format is one:
// "did you mean 'x'?", appended to a message as " — did you mean 'x'?" by with_suggestion.

#include <span>
#include <string>
#include <string_view>

namespace choreo {

/// Edits turning `a` into `b` (insert, delete, substitute, or swap two neighbours: "strat" -> "start" is 1),
/// ignoring ASCII case.
size_t edit_distance(std::string_view a, std::string_view b);

/// The candidate closest to `name` when it is a likely typo, else "": at most a third of the name's letters
/// (at least 1, at most 3 edits) away; an exact match and names over 64 bytes get none.
std::string closest_name(std::string_view name, std::span<const std::string_view> candidates);
std::string closest_name(std::string_view name, std::span<const std::string> candidates);

/// "did you mean 'x'?" for the closest candidate, or "" when none is close (for a hint of its own).
std::string did_you_mean(std::string_view name, std::span<const std::string_view> candidates);
std::string did_you_mean(std::string_view name, std::span<const std::string> candidates);

/// `base` plus " — did you mean 'x'?" when a close candidate exists, else `base`.
std::string with_suggestion(std::string base, std::string_view name, std::span<const std::string_view> candidates);
std::string with_suggestion(std::string base, std::string_view name, std::span<const std::string> candidates);

/// The position of `name` in `names` (an enum's names, in the enum's order); else an InputError
/// "unknown WHAT 'name'" with a suggestion, and the hint "the PLURAL are a, b, c".
size_t index_of_name(std::string_view name, std::span<const std::string_view> names, std::string_view what,
                     std::string_view plural);

}  // namespace choreo
