#include "cli/run_output.h"

#include "common/error.h"
#include "runtime/exec/run_report.h"

namespace choreo::cli {

nlohmann::ordered_json run_document(const dsl::Workflow& workflow, const std::string& mode, bool no_leak,
                                    nlohmann::ordered_json tiers, const std::string& model_path,
                                    const std::vector<exec::InputRow>& rows,
                                    const std::vector<exec::InstanceOutcome>& outcomes) {
  nlohmann::ordered_json j;
  j["workflow"] = workflow.name.value;
  j["model"] = model_path;
  j["mode"] = mode;
  j["no_leak"] = no_leak;
  j["tiers"] = std::move(tiers);
  auto run_of = [](const exec::InstanceOutcome& outcome) {
    nlohmann::ordered_json e;
    if (outcome.error) {
      e["incomplete"] = true;
      e["error"] = describe_error(outcome.error);
    }
    e.update(exec::run_json(outcome.result));
    return e;
  };
  if (rows.empty()) {
    j.update(run_of(outcomes.at(0)));
    return j;
  }
  j["instances"] = nlohmann::ordered_json::array();
  for (size_t i = 0; i < outcomes.size(); ++i) {
    nlohmann::ordered_json e = {{"line", rows[i].line}};
    e.update(run_of(outcomes[i]));
    j["instances"].push_back(e);
  }
  return j;
}

std::string output_block(const std::string& output) { return "── output\n" + output + "\n"; }

}  // namespace choreo::cli
