#pragma once
// A workflow message that is a PML prompt (`pml:` and `prompt:`, docs/pml.md): its schema file, confined to
// the workflow's directory like every file a workflow names, loaded and parsed, and its prompt parsed, when
// the plan is made (compile with the names known, or the run's elaboration), never while calls run.

#include <map>
#include <memory>
#include <string>

#include "dsl/pml/ast.h"
#include "dsl/workflow.h"

namespace choreo::dsl::plan {

/// A PML message's schema and prompt, parsed.
struct PmlMessage {
  std::shared_ptr<const pml::Schema> schema;
  std::shared_ptr<const pml::Prompt> prompt;
};

/// Loads PML messages' schemas, each file once (by its confined path).
class PmlLoader {
 public:
  explicit PmlLoader(const Workflow& workflow) : workflow_(workflow) {}
  /// Message `m` of the workflow with its schema path and prompt rendered. InputError at m's `pml:` when the
  /// path leads outside the workflow's directory (and the allowed ones) or names no file, and the schema's or
  /// the prompt's own errors (a schema a data row chose is not quoted: the user never named that file).
  PmlMessage load(const Message& m, const std::string& file, const std::string& prompt);

 private:
  const Workflow& workflow_;
  std::map<std::string, std::shared_ptr<const pml::Schema>> schemas_;
};

}  // namespace choreo::dsl::plan
