#include "runtime/eval/longbench_metrics.h"

#include <algorithm>
#include <map>

#include "common/error.h"
#include "common/regex.h"
#include "runtime/eval/python_text.h"

namespace choreo::eval {

namespace {

bool is_ascii_punctuation(char c) {
  static constexpr std::string_view kPunctuation = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
  return kPunctuation.find(c) != std::string_view::npos;
}

const Regex& articles() {
  static const Regex regex(R"(\b(a|an|the)\b)");
  return regex;
}

const Regex& numbers() {
  static const Regex regex(R"(\d+)");
  return regex;
}

const Regex& paragraph_number() {
  static const Regex regex(R"(Paragraph (\d+))");
  return regex;
}

/// The share of `numbers` equal to `wanted` (0 when there are none): count_score's and retrieval_score's
/// core.
double share_equal(const std::vector<std::string>& found, std::string_view wanted) {
  if (found.empty()) return 0.0;
  const auto right = std::count(found.begin(), found.end(), wanted);
  return static_cast<double>(right) / static_cast<double>(found.size());
}

}  // namespace

std::string normalize_answer(std::string_view text) {
  std::string lowered = lower(text);
  std::string no_punctuation;
  no_punctuation.reserve(lowered.size());
  for (char c : lowered)  // punctuation is ASCII, so bytes are safe: UTF-8 continuation bytes are >= 0x80
    if (!is_ascii_punctuation(c)) no_punctuation.push_back(c);
  return join(split_whitespace(articles().replace_all(no_punctuation, " ")), " ");
}

double qa_f1_score(std::string_view prediction, std::string_view gold) {
  const std::vector<std::string> predicted = split_whitespace(normalize_answer(prediction));
  const std::vector<std::string> wanted = split_whitespace(normalize_answer(gold));
  std::map<std::string, int> counts;
  for (const std::string& token : wanted) ++counts[token];
  int same = 0;
  for (const std::string& token : predicted) {
    auto it = counts.find(token);
    if (it != counts.end() && it->second > 0) {
      --it->second;
      ++same;
    }
  }
  if (same == 0) return 0.0;
  const double precision = static_cast<double>(same) / static_cast<double>(predicted.size());
  const double recall = static_cast<double>(same) / static_cast<double>(wanted.size());
  return 2 * precision * recall / (precision + recall);
}

double classification_score(std::string_view prediction, std::string_view gold,
                            const std::vector<std::string>& all_classes) {
  std::vector<std::string> matched;
  for (const std::string& name : all_classes)
    if (prediction.find(name) != std::string_view::npos) matched.push_back(name);
  // The reference removes from the list it is iterating over: after a removal Python's list iterator
  // skips the element that slid into the current slot. Mirrored on purpose.
  for (size_t i = 0; i < matched.size(); ++i) {
    const std::string term = matched[i];
    if (gold.find(term) != std::string_view::npos && term != gold)
      matched.erase(std::find(matched.begin(), matched.end(), term));
  }
  // The reference's `em_match_list != 0` is always true, so its string-similarity fallback never runs.
  if (std::find(matched.begin(), matched.end(), gold) == matched.end()) return 0.0;
  return 1.0 / static_cast<double>(matched.size());
}

double retrieval_score(std::string_view prediction, std::string_view gold) {
  const std::vector<std::string> ids = paragraph_number().find_all(gold);
  if (ids.empty())
    throw InputError(fmt::format("the gold answer '{}' names no paragraph", gold.substr(0, 80)),
                     "retrieval gold answers look like \"Paragraph 12\"");
  return share_equal(find_numbers(prediction), ids[0]);
}

double count_score(std::string_view prediction, std::string_view gold) {
  return share_equal(find_numbers(prediction), gold);
}

std::vector<std::string> find_numbers(std::string_view text) { return numbers().find_all(text); }

}  // namespace choreo::eval
