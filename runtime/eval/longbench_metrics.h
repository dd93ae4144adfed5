#pragma once
// LongBench's per-answer scores (THUDM/LongBench metrics.py), rule for rule: SQuAD-normalised token F1,
// classification, passage retrieval and passage count. Rouge-L lives in rouge.h. Each returns a score in
// [0, 1] for one prediction against one gold answer; score.h takes the max over gold answers.

#include <string>
#include <string_view>
#include <vector>

namespace choreo::eval {

/// SQuAD's normalize_answer: lower-case, drop ASCII punctuation (Python's string.punctuation), replace the
/// words a|an|the by a space, collapse whitespace.
std::string normalize_answer(std::string_view text);

/// qa_f1_score: token F1 between the whitespace tokens of the normalised texts (0 when nothing overlaps).
double qa_f1_score(std::string_view prediction, std::string_view gold);

/// classification_score: the classes named in the prediction, after the reference's pruning of classes
/// contained in the gold label, score 1/len when the gold label is among them, else 0.
double classification_score(std::string_view prediction, std::string_view gold,
                            const std::vector<std::string>& all_classes);

/// retrieval_score: the share of the prediction's numbers that equal the N of the gold's "Paragraph N".
/// Throws InputError when the gold has no "Paragraph N" (the reference fails there too).
double retrieval_score(std::string_view prediction, std::string_view gold);

/// count_score: the share of the prediction's numbers that equal the gold text.
double count_score(std::string_view prediction, std::string_view gold);

/// Python's re.findall(r"\d+", text) (Unicode digits, as Python 3 matches them).
std::vector<std::string> find_numbers(std::string_view text);

}  // namespace choreo::eval
