// Malformed PML schemas and prompts: each must be an InputError naming the file, the line:col of the offending
// construct (worked out by hand from the text below) and what is wrong.

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>

#include "dsl/pml/prompt_parser.h"
#include "dsl/pml/schema_parser.h"
#include "tests/scratch_dir.h"
#include "tests/test_paths.h"

namespace choreo::dsl::pml {
namespace {

std::string schema_error(std::string_view text) {
  try {
    parse_schema(text, "bad.pml");
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string prompt_error(std::string_view text) {
  try {
    parse_prompt(text, SourceLocation{"p.pml", 1, 1});
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

void check_error(const std::string& what, const std::string& location, const std::string& message) {
  INFO("error: ", what);
  CHECK(what.rfind(location + ": ", 0) == 0);
  CHECK(what.find(message) != std::string::npos);
}

TEST_CASE("pml errors: XML structure") {
  check_error(schema_error("<schema name=\"s\">\n<module name=\"a\">text\n</schema>"), "bad.pml:3:1",
              "closing tag </schema> does not match <module> opened at 2:1");
  check_error(schema_error("<schema name=\"s\">\n<module name=\"a\">\ntext"), "bad.pml:2:1", "<module> is never closed");
  check_error(schema_error("<schema name=\"s\"/>\nextra"), "bad.pml:2:1", "text after the root element");
  check_error(schema_error("<schema name=\"s\">\n<![CDATA[ x < y ]]>\n</schema>"), "bad.pml:2:1",
              "CDATA sections are not supported");
  check_error(schema_error(""), "bad.pml:1:1", "the document has no element");
  std::string deep = "<schema name=\"s\">";
  for (int i = 0; i < 300; ++i) deep += "<module name=\"m" + std::to_string(i) + "\">";
  std::string what = schema_error(deep);
  CHECK(what.rfind("bad.pml:1:", 0) == 0);  // at the first element too deep (column depends on the names)
  CHECK(what.find("elements nested deeper than 200 levels") != std::string::npos);
}

TEST_CASE("pml errors: escaping of '<' and '&' in text") {
  check_error(schema_error("<schema name=\"s\">\n  a & b\n</schema>"), "bad.pml:2:5", "'&' in text must be written &amp;");
  check_error(schema_error("<schema name=\"s\">\n  a &nbsp; b\n</schema>"), "bad.pml:2:5", "unknown entity '&nbsp;'");
  check_error(schema_error("<schema name=\"s\">\n  if a < b\n</schema>"), "bad.pml:2:8", "'<' in text must be written &lt;");
  check_error(schema_error("<schema name=\"s\">\n  &#xD800;\n</schema>"), "bad.pml:2:3", "unknown entity");
}

TEST_CASE("pml errors: attributes") {
  check_error(schema_error("<schema name=\"s\">\n<module name=\"a\" name=\"b\"/>\n</schema>"), "bad.pml:2:18",
              "attribute 'name' is given twice in <module>");
  check_error(schema_error("<schema name=\"s\">\n<module name=a/>\n</schema>"), "bad.pml:2:14",
              "the value of attribute 'name' must be quoted");
  check_error(schema_error("<schema name=\"s\">\n<module name=\"a\" cahce=\"false\"/>\n</schema>"), "bad.pml:2:18",
              "unknown attribute 'cahce' on <module> — did you mean 'cache'?");
  check_error(schema_error("<schema name=\"s\">\n<module name=\"a\" cache=\"no\"/>\n</schema>"), "bad.pml:2:18",
              "cache=\"no\" must be \"true\" or \"false\"");
}

TEST_CASE("pml errors: names and scopes") {
  check_error(schema_error("<schema name=\"s\">\n<module>text</module>\n</schema>"), "bad.pml:2:1", "<module> has no name");
  check_error(schema_error("<schema name=\"s\">\n<module name=\"9lives\"/>\n</schema>"), "bad.pml:2:9",
              "'9lives' is not a valid module name");
  check_error(schema_error("<schema name=\"s\">\n<module name=\"a\"/>\n<module name=\"a\"/>\n</schema>"), "bad.pml:3:9",
              "module 'a' is defined twice in the same scope");
  check_error(schema_error("<schema name=\"s\">\n<module name=\"a\"/>\n<union><module name=\"a\"/></union>\n</schema>"),
              "bad.pml:3:16", "module 'a' is defined twice in the same scope");
  check_error(schema_error("<schema name=\"s\">\n<module name=\"m\"><parameter name=\"p\"/>\n<parameter name=\"p\"/>"
                           "</module>\n</schema>"),
              "bad.pml:3:12", "parameter 'p' is defined twice in one module");
  check_error(schema_error("<schema name=\"s\">\n<module name=\"user\"/>\n</schema>"), "bad.pml:2:9",
              "'user' is a role tag and cannot name a module");
  // The same name in different scopes is fine.
  CHECK(schema_error("<schema name=\"s\"><module name=\"a\"><module name=\"a\"/></module></schema>") == "(no error)");
}

TEST_CASE("pml errors: elements in the wrong place") {
  check_error(schema_error("<prompt schema=\"s\"/>"), "bad.pml:1:1", "expected <schema>, found <prompt>");
  check_error(schema_error("<schema name=\"s\">\n  <modul name=\"a\"/>\n</schema>"), "bad.pml:2:3",
              "unknown element <modul> in a schema — did you mean 'module'?");
  check_error(schema_error("<schema name=\"s\">\n<parameter name=\"p\"/>\n</schema>"), "bad.pml:2:1",
              "<parameter> outside a module");
  check_error(schema_error("<schema name=\"s\">\n<union>\n  stray <module name=\"a\"/></union>\n</schema>"), "bad.pml:3:3",
              "text directly inside <union>");
  check_error(schema_error("<schema name=\"s\">\n<union></union>\n</schema>"), "bad.pml:2:1", "empty <union>");
  check_error(schema_error("<schema name=\"s\">\n<union scaffold=\"c\"><module name=\"a\"/><module name=\"b\"/></union>\n"
                           "</schema>"),
              "bad.pml:2:8", "scaffold=\"c\" names no member of this union");
  check_error(schema_error("<schema name=\"s\">\n<user><module name=\"m\"><system>x</system></module></user>\n</schema>"),
              "bad.pml:2:24", "<system> inside another role");
  check_error(schema_error("<schema name=\"s\">\n<module name=\"m\"><parameter name=\"p\">x</parameter></module>\n"
                           "</schema>"),
              "bad.pml:2:38", "<parameter name=\"p\"> has content");
}

TEST_CASE("pml errors: parameter lengths and src files") {
  check_error(schema_error("<schema name=\"s\">\n<module name=\"m\"><parameter name=\"p\" length=\"0\"/></module>\n"
                           "</schema>"),
              "bad.pml:2:38", "length=\"0\" is not a whole number of tokens");
  check_error(schema_error("<schema name=\"s\">\n<module name=\"m\"><parameter name=\"p\" length=\"3x\"/></module>\n"
                           "</schema>"),
              "bad.pml:2:38", "length=\"3x\" is not a whole number of tokens");
  check_error(schema_error("<schema name=\"s\">\n<module name=\"a\" src=\"nope.txt\"/>\n</schema>"), "bad.pml:2:18",
              "src file 'nope.txt' not found");
  check_error(schema_error("<schema name=\"s\">\n<module name=\"a\" src=\"x.txt\">body</module>\n</schema>"),
              "bad.pml:2:30", "module 'a' has src=\"x.txt\" and content of its own");
}

// Workflow YAML refused these bytes and PML read them (issue 42, finding 12).
TEST_CASE("pml errors: a NUL byte and bytes that are not UTF-8, in a schema, a prompt and a src= file") {
  check_error(
      schema_error(std::string("<schema name=\"s\">\n<module name=\"m\">a\xff b</module>\n</schema>")),
      "bad.pml:2:19", "invalid UTF-8 byte 0xFF");
  check_error(
      schema_error(std::string_view("<schema name=\"s\">\n<module name=\"m\">a\0b</module>\n</schema>", 57)),
      "bad.pml:2:19", "NUL byte in PML text");
  check_error(schema_error("<schema name=\"s\">\n<module name=\"m\">\xc3\x28</module>\n</schema>"),
              "bad.pml:2:18",
              "invalid UTF-8 byte 0xC3");  // a lead byte without its continuation
  check_error(prompt_error("<prompt schema=\"s\">\n  caf\xe9\n</prompt>"), "p.pml:2:6",
              "invalid UTF-8 byte 0xE9");
  CHECK(schema_error("<schema name=\"s\"><module name=\"m\">caf\xc3\xa9 \xe2\x82\xac</module></schema>") ==
        "(no error)");

  testing::ScratchDir dir;
  const std::string schema = (dir.path / "s.pml").string();
  std::ofstream(schema) << "<schema name=\"s\">\n<module name=\"m\" src=\"t.txt\"/>\n</schema>\n";
  const std::pair<std::string, std::string> cases[] = {
      {std::string("one\ntwo \xff", 9), "line 2 (byte 9 of the file) holds the byte 0xFF"},
      {std::string("one\0", 4), "line 1 (byte 4 of the file) holds a NUL byte"}};
  for (const auto& [text, says] : cases) {
    std::ofstream(dir.path / "t.txt", std::ios::binary) << text;
    const std::string what = testing::input_error_text([&] { load_schema(schema); });
    INFO(what);
    CHECK(what.find(schema + ":2:18: ") != std::string::npos);
    CHECK(what.find(says) != std::string::npos);
  }
}

TEST_CASE("pml errors: prompts") {
  check_error(prompt_error("<prompt>\n<a/></prompt>"), "p.pml:1:1", "<prompt> names no schema");
  check_error(prompt_error("<prompt schema=\"s\">\n  <a x=\"1\" x=\"2\"/>\n</prompt>"), "p.pml:2:12",
              "attribute 'x' is given twice in <a>");
  check_error(prompt_error("<schema name=\"s\"/>"), "p.pml:1:1", "expected <prompt>, found <schema>");
  check_error(prompt_error("<prompt schema=\"s\">\n<a>\n</prompt>"), "p.pml:3:1",
              "closing tag </prompt> does not match <a> opened at 2:1");
  check_error(prompt_error("<prompt schema=\"s\">\n<user>Q <assistant/></user></prompt>"), "p.pml:2:9",
              "<assistant> inside another role");
  // Inside a workflow file the locations are the file's.
  try {
    parse_prompt("<prompt schema=\"s\">a & b</prompt>", SourceLocation{"wf.yaml", 7, 13});
    FAIL("no error");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).rfind("wf.yaml:7:34: ", 0) == 0);
  }
}

}  // namespace
}  // namespace choreo::dsl::pml
