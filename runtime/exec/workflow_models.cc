#include "runtime/exec/workflow_models.h"

#include <filesystem>
#include <map>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.h"
#include "common/input_file.h"
#include "runtime/exec/reuse_plan_file.h"

namespace choreo::exec {

std::filesystem::path find_workflow_file(const dsl::Workflow& w, const dsl::Text& name, std::string_view what) {
  // Confined as PML src= and pml: paths are (docs/limits.md): a workflow from elsewhere must not make choreo
  // read files outside its own directory. The candidates (as given, then beside the workflow) are checked for
  // confinement before existence, so that the error cannot tell whether a file outside exists.
  const std::filesystem::path referrer =
      w.file.empty() ? std::filesystem::path("workflow") : std::filesystem::path(w.file);
  std::vector<std::filesystem::path> candidates{name.value};
  if (!w.file.empty()) candidates.push_back(std::filesystem::path(w.file).parent_path() / name.value);
  bool any_confined = false;
  for (const std::filesystem::path& candidate : candidates) {
    if (!path_is_confined(referrer, candidate)) continue;
    any_confined = true;
    std::error_code ec;
    if (std::filesystem::is_regular_file(candidate, ec)) return candidate;
  }
  if (!any_confined)
    throw InputError(
        fmt::format("{} '{}' leads outside the directory of {}", what, name.value,
                    w.file.empty() ? std::string("the workflow") : referrer.filename().string()),
        "files a workflow names must be in its directory or below it; allow another directory with --allow-path "
        "DIR (docs/limits.md)",
        name.where, w.source_line(name.where.line));
  throw InputError(fmt::format("{} '{}' is not a file", what, name.value),
                   "paths are as given, or relative to the workflow file's directory", name.where,
                   w.source_line(name.where.line));
}

namespace {

std::string canonical_path(const std::filesystem::path& p) {
  std::error_code ec;
  const std::filesystem::path c = std::filesystem::weakly_canonical(p, ec);
  return ec ? p.string() : c.string();
}

}  // namespace

namespace {

/// Adds the models `w` declares to `set` (whose model 0 is the run's, `base`): weights other than base's go
/// to `owned`.
void add_models(const dsl::Workflow& w, const model::Model& base, runtime::ModelSet& set,
                std::vector<std::unique_ptr<model::Model>>& owned);

}  // namespace

WorkflowModels load_workflow_models(const dsl::Workflow& w, const model::Model& base, model::LoraStack base_lora) {
  WorkflowModels out{{}, runtime::ModelSet(base, std::move(base_lora))};
  add_models(w, base, out.set, out.owned);
  return out;
}

std::function<void(const model::Model&, runtime::ModelSet&, runtime::ExtraModels&)> workflow_models_adder(
    const dsl::Workflow& workflow) {
  return [&workflow](const model::Model& base, runtime::ModelSet& set, runtime::ExtraModels& extra) {
    add_models(workflow, base, set, extra.owned);
  };
}

std::string workflow_model_path(const dsl::Workflow& workflow, const std::string& flag_path) {
  if (!flag_path.empty() || !workflow.model) return flag_path;
  try {
    return find_workflow_file(workflow, *workflow.model, "the workflow's model").string();
  } catch (const InputError& e) {
    throw InputError(e.message(), e.hint() + "; or pass the model's path with -m", workflow.model->where,
                     workflow.source_line(workflow.model->where.line));
  }
}

namespace {

void add_models(const dsl::Workflow& w, const model::Model& base, runtime::ModelSet& out_set,
                std::vector<std::unique_ptr<model::Model>>& owned) {
  struct {
    std::vector<std::unique_ptr<model::Model>>& owned;
    runtime::ModelSet& set;
  } out{owned, out_set};
  std::map<std::string, const model::Model*> by_path{{canonical_path(base.file().path()), &base}};
  // Errors from the model code name the file and the tensor; the declaration's location is added here.
  const auto at = [&](const dsl::Text& where, const InputError& e) {
    return InputError(e.message(), e.hint(), where.where, w.source_line(where.where.line));
  };
  for (const dsl::ModelDecl& decl : w.models) {
    const model::Model* weights = &base;
    if (decl.file) {
      const std::string path = canonical_path(find_workflow_file(w, *decl.file, "model file"));
      auto it = by_path.find(path);
      if (it == by_path.end()) {
        try {
          out.owned.push_back(model::Model::load(path, base.backend()));
        } catch (const InputError& e) {
          throw at(*decl.file, e);
        }
        it = by_path.emplace(path, out.owned.back().get()).first;
      }
      weights = it->second;
    }
    model::LoraStack lora;
    for (const dsl::AdapterDecl& a : decl.lora) {
      const std::string path = find_workflow_file(w, a.file, "LoRA adapter").string();
      try {
        lora.adapters.push_back({model::LoraAdapter::load(path, *weights), float(a.scale)});
      } catch (const InputError& e) {
        throw at(a.file, e);
      }
    }
    try {
      out.set.add(decl.name.value, *weights, std::move(lora));
    } catch (const InputError& e) {
      throw at(decl.name, e);
    }
  }
  // Cross-model plans, once every model is known.
  for (const dsl::ModelDecl& decl : w.models) {
    const int receiver = *out.set.find(decl.name.value);
    for (const dsl::ReuseDecl& r : decl.reuse) {
      if (r.file) {
        const std::string path = find_workflow_file(w, *r.file, "plan file").string();
        ReusePlanFile file;
        try {
          file = read_reuse_plan(path);
        } catch (const InputError& e) {
          throw at(*r.file, e);
        }
        const runtime::EngineModel& reader = out.set[size_t(receiver)];
        if (file.receiver != reader.fingerprint)
          throw InputError(fmt::format("plan file {} was profiled for the receiver {}, not for model `{}`", path,
                                       file.receiver_spec, decl.name.value),
                           "profile this model: choreo profile reuse --receiver ...", r.file->where,
                           w.source_line(r.file->where.line));
        int found = 0;
        try {
          found = apply_reuse_plan(out.set, file, receiver);
        } catch (const InputError& e) {
          throw at(*r.file, e);
        }
        if (found == 0)
          throw InputError(fmt::format("plan file {} reads the sender {}, which no model of this run is", path,
                                       file.sender_spec),
                           "declare that model (same file, adapters and scales) or profile another pair",
                           r.file->where, w.source_line(r.file->where.line));
        continue;
      }
      const std::optional<int> sender = out.set.find(r.from.value);
      if (!sender) {
        std::vector<std::string> names;
        for (size_t i = 0; i < out.set.size(); ++i) names.push_back(out.set[i].name);
        throw InputError(fmt::format("unknown model `{}`", r.from.value),
                         fmt::format("`from` names a model: {}", fmt::join(names, ", ")), r.from.where,
                         w.source_line(r.from.where.line));
      }
      // The parser admits the three kinds only, and `layers` with `partial` only.
      runtime::CrossModelPlan plan{*runtime::CrossModelPlan::parse_kind(r.plan.value), {}};
      if (r.begin) plan.ranges = {{int(*r.begin), int(*r.end)}};
      try {
        out.set.set_plan(*sender, receiver, plan);
      } catch (const InputError& e) {
        throw at(r.plan, e);
      }
    }
  }
}

}  // namespace

}  // namespace choreo::exec
