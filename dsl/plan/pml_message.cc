#include "dsl/plan/pml_message.h"

#include <filesystem>

#include <fmt/format.h>

#include "common/error.h"
#include "common/input_file.h"
#include "dsl/pml/prompt_parser.h"
#include "dsl/pml/schema_parser.h"

namespace choreo::dsl::plan {

PmlMessage PmlLoader::load(const Message& m, const std::string& file, const std::string& prompt) {
  const auto at_pml = [&](const std::string& message, const std::string& hint) {
    return InputError(message, hint, m.pml->where, workflow_.source_line(m.pml->where.line));
  };
  // The path is relative to the workflow file and must stay inside its directory (or one allowed with
  // --allow-path): a template lets a data row choose the file, and a row must not choose /etc/shadow.
  std::filesystem::path path;
  try {
    path = confine_path(workflow_.file.empty() ? "<workflow>" : workflow_.file, file, "pml: ");
  } catch (const InputError& e) {
    throw at_pml(e.message(), e.hint());
  }
  if (!std::filesystem::exists(path))
    throw at_pml(fmt::format("PML schema file '{}' does not exist", file),
                 "paths are relative to the workflow file's directory");
  PmlMessage out;
  auto cached = schemas_.find(path.string());
  if (cached == schemas_.end()) {
    try {
      auto schema = std::make_shared<const pml::Schema>(pml::load_schema(path.string(), nullptr, Origin::Referred));
      cached = schemas_.emplace(path.string(), std::move(schema)).first;
    } catch (const InputError& e) {
      // A path the data chose names a file the user never named: its errors do not quote its contents.
      if (m.pml->value.find("{{") == std::string::npos) throw;
      throw InputError(e.message(), e.hint(), e.where());
    }
  }
  out.schema = cached->second;
  out.prompt = std::make_shared<const pml::Prompt>(pml::parse_prompt(prompt, m.prompt->where));
  return out;
}

}  // namespace choreo::dsl::plan
