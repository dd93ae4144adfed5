// libFuzzer target for the workflow parser and the plan compiler (`choreo check`): any bytes must either parse
// into a Workflow or throw InputError, never crash, hang, leak or throw anything else (a yaml-cpp exception
// escaping would be a bug). A workflow that parses must have every location inside the text, and re-parsing
// the same text must give the same AST shape (the parser has no hidden state); compiling it (under a small
// work bound) gives a plan or an InputError. Some inputs are generated deep or large (fuzz_common.h,
// expand()): nested flow collections, long step lists, lets that nest or double a value in a loop.
// With CHOREO_FUZZ_SEED_DIR set, start-up copies workflows/*.yaml there as seeds (scripts/fuzz.sh).

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>

#include "dsl/plan/plan.h"
#include "dsl/workflow_parser.h"
#include "common/error.h"
#include "tests/fuzz/fuzz_common.h"

namespace {

using choreo::fuzz::line_count;

void check_location(const choreo::SourceLocation& where, int lines) {
  if (where.file != "fuzz.yaml" || where.line < 1 || where.line > lines || where.col < 1) __builtin_trap();
}

void check_steps(const std::vector<choreo::dsl::Step>& steps, int lines, size_t& count) {
  using namespace choreo::dsl;
  for (const Step& s : steps) {
    ++count;
    if (auto* c = std::get_if<Call>(&s.node)) {
      check_location(c->where, lines);
      check_location(c->as.text.where, lines);
      for (const Parent& p : c->parents) check_location(p.ref.where, lines);
    } else if (auto* r = std::get_if<Repeat>(&s.node)) {
      check_location(r->loop.variable.where, lines);
      check_steps(r->steps, lines, count);
    } else if (auto* l = std::get_if<Let>(&s.node)) {
      for (const Binding& b : l->bindings) check_location(b.value.where, lines);
    } else if (auto* sel = std::get_if<Select>(&s.node)) {
      check_location(sel->choice.where, lines);
    }
  }
}

/// Compiles `w` as `choreo check` does (with a small work bound); an error must be an InputError, located in
/// the file unless it is about a value with no place in it (a param default past the value limits).
void compile(const choreo::dsl::Workflow& w) {
  try {
    const choreo::dsl::plan::Plan plan = choreo::dsl::plan::compile(w, {{}, {}, 10'000});
    if (plan.call_count() > 10'000) __builtin_trap();  // every call and every branch costs a step
  } catch (const choreo::InputError& e) {
    if (!e.where().file.empty() && e.where().file != "fuzz.yaml") __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = std::getenv("CHOREO_FUZZ_SEED_DIR");
  const char* source = std::getenv("CHOREO_SOURCE_DIR");
  if (dir && source) {
    std::filesystem::path workflows = std::filesystem::path(source) / "workflows";
    std::error_code ignored;
    for (const auto& entry : std::filesystem::directory_iterator(workflows, ignored)) {
      std::filesystem::copy_file(entry.path(), std::filesystem::path(dir) / entry.path().filename(),
                                 std::filesystem::copy_options::overwrite_existing, ignored);
    }
  }
  return 0;
}

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned seed) {
  return choreo::fuzz::mutate(
      data, size, max_size, seed,
      {{"name: w\nsteps: ", "[", "", "]", "\n"},
       {"name: w\nparams: {p: ", "[", "1", "]", "}\nsteps:\n  - let: {x: \"p\"}\n"},
       {"name: w\nsteps:\n  - let: {x: \"", "[", "1", "]", "\"}\n"},
       {"name: w\nsteps:\n", "  - let: {x: \"1\"}\n", "", "", ""},
       {"name: w\nmessages:\n  m: {text: \"hi\"}\nsteps:\n  - repeat: \"i in range(", "9", "", "", ")\"\n"
        "    steps:\n      - let: {x: \"[x, x] if i > 0 else [m]\"}\n"},
       {"name: w\nsteps:\n  - repeat: \"i in range(", "9", "", "", ")\"\n    steps:\n"
        "      - let: {x: \"[x] if i > 0 else []\"}\n"},
       {"name: w\nmessages:\n  m: {text: \"hi\"}\nsteps:\n  - prefill: {as: \"a[i]\", for: \"i in range(", "9", "",
        "", ")\", text: \"x\", parents: [m]}\n"}});
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string expanded = choreo::fuzz::expand(std::string_view(reinterpret_cast<const char*>(data), size), 1 << 20);
  const std::string_view text = expanded;
  try {
    choreo::dsl::Workflow w = choreo::dsl::parse_workflow(text, "fuzz.yaml");
    int lines = line_count(text);
    check_location(w.name.where, lines);
    for (const auto& m : w.messages) check_location(m.where, lines);
    size_t count = 0;
    check_steps(w.steps, lines, count);
    choreo::dsl::Workflow again = choreo::dsl::parse_workflow(text, "fuzz.yaml");
    size_t count_again = 0;
    check_steps(again.steps, lines, count_again);
    if (count != count_again || again.messages.size() != w.messages.size()) __builtin_trap();
    compile(w);
  } catch (const choreo::InputError& e) {
    if (std::strncmp(e.what(), "fuzz.yaml", 9) != 0) __builtin_trap();  // every rejection names the file
  }
  return 0;
}
