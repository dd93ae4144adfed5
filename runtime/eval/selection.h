#pragma once
// Which rows a run takes and what each feeds the workflow: `--limit`, `--shard I/N` (a deterministic slice,
// so a cluster scheduler can spread one run over many jobs) and `--map input=field`.

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/eval/dataset.h"

namespace choreo::eval {

/// `--shard I/N`: rows whose index (after --limit) is I modulo N.
struct Shard {
  int index = 0, count = 1;
};
/// Parses "I/N" with 0 <= I < N; InputError otherwise.
Shard parse_shard(std::string_view text);
/// True when the row at `row_index` belongs to `shard`.
bool in_shard(size_t row_index, Shard shard);
/// The first `limit` rows (all when limit < 0), then the shard's slice of them, in order. Applying the
/// limit first makes the shards of a limited run add up to the unsharded limited run.
std::vector<Row> select_rows(const std::vector<Row>& rows, long limit, Shard shard);

/// `--map input=field`: which row field feeds each workflow input.
class InputMap {
 public:
  /// Parses "input=field" pairs; InputError for a pair without '=' or an input given twice.
  static InputMap parse(const std::vector<std::string>& pairs);
  /// The workflow's inputs for `row`: each declared input takes the field it is mapped to, else the field
  /// of its own name. InputError (naming the data file, the row's line and the fields it has) when a
  /// field is missing.
  std::map<std::string, std::string> apply(const Row& row, const std::vector<std::string>& declared_inputs,
                                           const std::string& data_path) const;
  const std::map<std::string, std::string>& pairs() const { return input_to_field_; }

 private:
  std::map<std::string, std::string> input_to_field_;
};

}  // namespace choreo::eval
