// libFuzzer target for the PML parsers (dsl/pml): any bytes, read as a schema and as a prompt, must either
// parse or throw InputError naming the file — never crash, hang, leak or throw anything else. A document
// that parses must have every location inside the text and parse again to the same shape. Some inputs are
// generated deep or large (fuzz_common.h, expand()): nested modules and imports, long texts full of entities
// and comments, tags with many attributes, unions with many members — megabytes that must parse in linear time.
// With CHOREO_FUZZ_SEED_DIR set, start-up copies workflows/schemas/*.pml there as seeds (scripts/fuzz.sh).

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>

#include "dsl/pml/prompt_parser.h"
#include "dsl/pml/schema_parser.h"
#include "common/error.h"
#include "tests/fuzz/fuzz_common.h"

namespace {

using namespace choreo::dsl::pml;

using choreo::fuzz::line_count;

void check_location(const choreo::SourceLocation& where, int lines) {
  if (where.line < 1 || where.line > lines || where.col < 1) __builtin_trap();
}

size_t check_nodes(const std::vector<Node>& body, int lines) {
  size_t count = 0;
  for (const Node& n : body) {
    ++count;
    if (auto* t = std::get_if<Text>(&n.value)) {
      if (t->text.empty()) __builtin_trap();  // empty runs are never emitted
      if (t->where.file == "fuzz.pml") check_location(t->where, lines);
    } else if (auto* p = std::get_if<Parameter>(&n.value)) {
      check_location(p->where, lines);
      if (p->length < 1) __builtin_trap();
    } else if (auto* m = std::get_if<Module>(&n.value)) {
      check_location(m->where, lines);
      count += check_nodes(m->body, lines);
    } else if (auto* u = std::get_if<Union>(&n.value)) {
      check_location(u->where, lines);
      if (u->members.empty()) __builtin_trap();
      for (const Module& member : u->members) count += check_nodes(member.body, lines);
    }
  }
  return count;
}

size_t check_prompt(const std::vector<PromptNode>& body, int lines) {
  size_t count = 0;
  for (const PromptNode& n : body) {
    ++count;
    if (auto* im = std::get_if<Import>(&n.value)) {
      check_location(im->where, lines);
      for (const Argument& a : im->arguments) check_location(a.where, lines);
      count += check_prompt(im->body, lines);
    }
  }
  return count;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = std::getenv("CHOREO_FUZZ_SEED_DIR");
  const char* source = std::getenv("CHOREO_SOURCE_DIR");
  if (dir && source) {
    std::error_code ignored;
    for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::path(source) / "workflows" / "schemas", ignored))
      std::filesystem::copy_file(entry.path(), std::filesystem::path(dir) / entry.path().filename(),
                                 std::filesystem::copy_options::overwrite_existing, ignored);
  }
  return 0;
}

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned seed) {
  return choreo::fuzz::mutate(
      data, size, max_size, seed,
      {{"<schema name=\"s\">", "<module name=\"m\">", "x", "</module>", "</schema>"},
       {"<schema name=\"s\"><module name=\"m\">", "a &amp; b <!-- c --> &#x41;\n", "", "", "</module></schema>"},
       {"<schema name=\"s\"><module name=\"m\"", " a=\"1\"", ">", "", "</module></schema>"},
       {"<schema name=\"s\"><union>", "<module name=\"m\"><parameter name=\"p\"/></module>", "", "",
        "</union></schema>"},
       {"<prompt schema=\"s\">", "<m a=\"1\">", "x", "</m>", "<assistant/></prompt>"},
       {"<prompt schema=\"s\">", "<user>q</user> &lt; ", "", "", "</prompt>"}});
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string expanded = choreo::fuzz::expand(std::string_view(reinterpret_cast<const char*>(data), size), 1 << 20);
  const std::string_view text = expanded;
  const int lines = line_count(text);
  try {
    Schema s = parse_schema(text, "fuzz.pml");
    size_t count = check_nodes(s.body, lines);
    if (check_nodes(parse_schema(text, "fuzz.pml").body, lines) != count) __builtin_trap();
  } catch (const choreo::InputError& e) {
    if (std::strncmp(e.what(), "fuzz.pml", 8) != 0) __builtin_trap();  // every rejection names the file
  }
  try {
    Prompt p = parse_prompt(text, choreo::SourceLocation{"fuzz.pml", 1, 1});
    size_t count = check_prompt(p.body, lines);
    if (check_prompt(parse_prompt(text, choreo::SourceLocation{"fuzz.pml", 1, 1}).body, lines) != count)
      __builtin_trap();
  } catch (const choreo::InputError& e) {
    if (std::strncmp(e.what(), "fuzz.pml", 8) != 0) __builtin_trap();
  }
  return 0;
}
