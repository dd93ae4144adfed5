#pragma once
// Many instances of one workflow (`choreo run --inputs rows.jsonl --concurrency K`, `choreo profile`,
// `choreo eval`): rows of inputs read from JSON Lines, and a run of every row whose engine calls are batched
// across instances by a BatchScheduler.

#include <exception>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "dsl/workflow.h"
#include "runtime/exec/interpreter.h"

namespace choreo::exec {

/// One line of an inputs file: its 1-based line number and the run arguments it gives.
struct InputRow {
  int line = 0;
  RunArguments arguments;
};

/// Reads `path` (JSON Lines, one object per line; blank lines are skipped). Each object's keys that name an
/// input of `workflow` give that input (a JSON string verbatim, any other value as JSON text); other keys
/// are ignored, so dataset rows can be used as they are. `base` supplies `--input`/`--param` values every row
/// shares (a row's own value wins). A line that is not a JSON object, or a row that lacks an input with no
/// value in `base`, is an InputError at path:line:col. An empty file is an error. `fields` maps an input to
/// the row key it is read from when the names differ (`--map task=problem`).
std::vector<InputRow> read_input_rows(const std::string& path, const dsl::Workflow& workflow,
                                      const RunArguments& base,
                                      const std::map<std::string, std::string>& fields = {});

/// The instances of a profile: the first `limit` rows (0: all) of the inputs file `path` as read_input_rows
/// reads them, or, when `path` is empty, one instance of `base`.
std::vector<InputRow> instance_rows(const dsl::Workflow& workflow, const std::string& path, const RunArguments& base,
                                    const std::map<std::string, std::string>& fields, int limit);

/// What one instance produced: its result, or the error that stopped it.
struct InstanceOutcome {
  RunResult result;  ///< with an error: what the instance did before it failed
  std::exception_ptr error;
};

/// Settings of a many-instance run.
struct InstancesOptions {
  int concurrency = 1;   ///< instances in flight at once; their ready calls share engine batches
  bool no_leak = false;  ///< re-encode parents that carry other agents' private messages (LeakGuard)
  /// Hooks for instance i (called on that instance's worker thread, before it starts).
  std::function<RunHooks(size_t instance)> hooks;
};

/// Runs `workflow` once per element of `arguments` on `engine`; an instance's error does not stop the others.
std::vector<InstanceOutcome> run_instances(const dsl::Workflow& workflow, runtime::Engine& engine,
                                           const std::vector<RunArguments>& arguments,
                                           const InstancesOptions& options);

}  // namespace choreo::exec
