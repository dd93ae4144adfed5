#include "common/suggest.h"

#include <algorithm>
#include <fmt/format.h>
#include <vector>

#include "common/error.h"

namespace choreo {

namespace {

char lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

std::vector<std::string_view> views_of(std::span<const std::string> candidates) {
  return std::vector<std::string_view>(candidates.begin(), candidates.end());
}

}  // namespace

size_t edit_distance(std::string_view a, std::string_view b) {
  // Optimal string alignment over one (a.size() + 1) x (b.size() + 1) table.
  const size_t width = b.size() + 1;
  std::vector<size_t> d((a.size() + 1) * width);
  for (size_t i = 0; i <= a.size(); ++i) d[i * width] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const bool same = lower(a[i - 1]) == lower(b[j - 1]);
      size_t best = std::min({d[(i - 1) * width + j] + 1, d[i * width + j - 1] + 1,
                              d[(i - 1) * width + j - 1] + (same ? 0 : 1)});
      if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) && lower(a[i - 2]) == lower(b[j - 1]))
        best = std::min(best, d[(i - 2) * width + j - 2] + 1);
      d[i * width + j] = best;
    }
  }
  return d[a.size() * width + b.size()];
}

std::string closest_name(std::string_view name, std::span<const std::string_view> candidates) {
  if (name.size() > 64) return {};
  const size_t allowed = std::clamp<size_t>(name.size() / 3, 1, 3);
  std::string_view best;
  size_t best_distance = allowed + 1;
  for (std::string_view candidate : candidates) {
    if (candidate == name || candidate.size() > name.size() + allowed || name.size() > candidate.size() + allowed)
      continue;
    const size_t d = edit_distance(name, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  return std::string(best);
}

std::string closest_name(std::string_view name, std::span<const std::string> candidates) {
  return closest_name(name, views_of(candidates));
}

std::string did_you_mean(std::string_view name, std::span<const std::string_view> candidates) {
  const std::string best = closest_name(name, candidates);
  return best.empty() ? std::string() : fmt::format("did you mean '{}'?", best);
}

std::string did_you_mean(std::string_view name, std::span<const std::string> candidates) {
  return did_you_mean(name, views_of(candidates));
}

std::string with_suggestion(std::string base, std::string_view name, std::span<const std::string_view> candidates) {
  const std::string suggestion = did_you_mean(name, candidates);
  if (!suggestion.empty()) base += " — " + suggestion;
  return base;
}

std::string with_suggestion(std::string base, std::string_view name, std::span<const std::string> candidates) {
  return with_suggestion(std::move(base), name, views_of(candidates));
}

size_t index_of_name(std::string_view name, std::span<const std::string_view> names, std::string_view what,
                     std::string_view plural) {
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return i;
  throw InputError(with_suggestion(fmt::format("unknown {} '{}'", what, name), name, names),
                   fmt::format("the {} are {}", plural, fmt::join(names, ", ")));
}

}  // namespace choreo
