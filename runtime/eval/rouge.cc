#include "runtime/eval/rouge.h"

#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/eval/python_text.h"

namespace choreo::eval {

namespace {

/// The package's sentence split: pieces between "." that are non-empty *before* whitespace is collapsed,
/// so a piece of only spaces survives as "" (and later counts as one empty word).
std::vector<std::string> sentences(std::string_view text) {
  std::vector<std::string> out;
  for (const std::string& piece : split(text, "."))
    if (!piece.empty()) out.push_back(join(split_whitespace(piece), " "));
  return out;
}

/// Words as small integers, so the LCS table compares ints.
class WordIds {
 public:
  std::vector<int> words(const std::string& sentence) {
    std::vector<int> out;
    for (const std::string& word : split(sentence, " ")) out.push_back(id(word));
    return out;
  }
  int id(const std::string& word) { return ids_.emplace(word, static_cast<int>(ids_.size())).first->second; }

 private:
  std::unordered_map<std::string, int> ids_;
};

/// Adds the words of one longest common subsequence of x (reference) and y (hypothesis) to `lcs_words`,
/// tracing back through the table exactly as the package's _recon_lcs does (ties go to y's side).
void add_lcs_words(const std::vector<int>& x, const std::vector<int>& y, std::set<int>& lcs_words) {
  const size_t n = x.size(), m = y.size();
  std::vector<int> table((n + 1) * (m + 1), 0);
  auto at = [&](size_t i, size_t j) -> int& { return table[i * (m + 1) + j]; };
  for (size_t i = 1; i <= n; ++i)
    for (size_t j = 1; j <= m; ++j)
      at(i, j) = x[i - 1] == y[j - 1] ? at(i - 1, j - 1) + 1 : std::max(at(i - 1, j), at(i, j - 1));
  size_t i = n, j = m;
  while (i > 0 && j > 0) {
    if (x[i - 1] == y[j - 1]) {
      lcs_words.insert(x[i - 1]);
      --i, --j;
    } else if (at(i - 1, j) > at(i, j - 1)) {
      --i;
    } else {
      --j;
    }
  }
}

}  // namespace

double rouge_l_score(std::string_view prediction, std::string_view gold) {
  const std::vector<std::string> hypothesis = sentences(prediction);
  const std::vector<std::string> reference = sentences(gold);
  if (hypothesis.empty() || reference.empty()) return 0.0;  // the package raises; LongBench scores 0

  WordIds ids;
  std::vector<std::vector<int>> hypothesis_words, reference_words;
  std::set<int> distinct_hypothesis, distinct_reference;
  for (const std::string& s : hypothesis) {
    hypothesis_words.push_back(ids.words(s));
    distinct_hypothesis.insert(hypothesis_words.back().begin(), hypothesis_words.back().end());
  }
  for (const std::string& s : reference) {
    reference_words.push_back(ids.words(s));
    distinct_reference.insert(reference_words.back().begin(), reference_words.back().end());
  }

  // The package sums, per reference sentence, how much its LCS words grow one running set: the set's size.
  std::set<int> lcs_union;
  for (const std::vector<int>& r : reference_words)
    for (const std::vector<int>& h : hypothesis_words) add_lcs_words(r, h, lcs_union);

  const double llcs = static_cast<double>(lcs_union.size());
  const double recall = llcs / static_cast<double>(distinct_reference.size());
  const double precision = llcs / static_cast<double>(distinct_hypothesis.size());
  return 2.0 * ((precision * recall) / (precision + recall + 1e-8));
}

}  // namespace choreo::eval
