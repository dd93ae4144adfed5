#pragma once
// Rouge-L F as LongBench computes it: the `rouge` package (1.0.1, pltrdy) called as
// Rouge().get_scores([prediction], [gold], avg=True)["rouge-l"]["f"], with 0 when it raises. That is the
// summary-level union-LCS variant over sentences split at ".", with *sets* of words (the package's default
// `exclusive=True`): the union of the words of each reference sentence's LCS with each hypothesis sentence,
// over the number of distinct words on each side. The quirks are the definition; they are kept.

#include <string_view>

namespace choreo::eval {

/// LongBench's rouge_score(prediction, gold) in [0, 1].
double rouge_l_score(std::string_view prediction, std::string_view gold);

}  // namespace choreo::eval
