// The PML parser: structure, the whitespace rule, escaping, comments and the Prompt Cache compatibility
// attributes, each checked against what docs/pml.md says the text means.

#include <filesystem>
#include <fstream>
#include <functional>

#include <unistd.h>

#include <doctest/doctest.h>

#include "dsl/pml/prompt_parser.h"
#include "dsl/pml/schema_parser.h"
#include "dsl/pml/whitespace.h"
#include "dsl/pml/xml.h"

namespace choreo::dsl::pml {
namespace {

const Text& text_of(const Node& n) { return std::get<Text>(n.value); }
const Module& module_of(const Node& n) { return std::get<Module>(n.value); }

TEST_CASE("pml: a schema parses into modules, unions and parameters in document order") {
  Schema s = parse_schema(R"(<schema name="trip">
  Intro text.
  <module name="plan">
    Plan for <parameter name="days" length="4"/> days.
    <union scaffold="b">
      <module name="a">Alpha.</module>
      <module name="b" cache="false">Beta.</module>
    </union>
  </module>
</schema>)",
                          "trip.pml");
  CHECK(s.name == "trip");
  REQUIRE(s.body.size() == 2);
  CHECK(text_of(s.body[0]).text == "Intro text.");
  CHECK(text_of(s.body[0]).where.to_string() == "trip.pml:2:3");
  const Module& plan = module_of(s.body[1]);
  CHECK(plan.name == "plan");
  REQUIRE(plan.body.size() == 4);
  CHECK(text_of(plan.body[0]).text == "Plan for");
  const Parameter& days = std::get<Parameter>(plan.body[1].value);
  CHECK(days.name == "days");
  CHECK(days.length == 4);
  CHECK(days.space_before);
  CHECK(text_of(plan.body[2]).text == "days.");
  CHECK(text_of(plan.body[2]).space_before);
  const Union& u = std::get<Union>(plan.body[3].value);
  REQUIRE(u.members.size() == 2);
  CHECK(u.scaffold == "b");
  CHECK(u.members[0].cache);
  CHECK_FALSE(u.members[1].cache);
  CHECK(text_of(u.members[1].body[0]).text == "Beta.");
}

TEST_CASE("pml whitespace rule on text runs") {
  Spacing sp;
  auto a = sp.take("first\n\t line   two");
  REQUIRE(a);
  CHECK(a->text == "first line two");
  CHECK_FALSE(a->space_before);  // nothing before it
  CHECK_FALSE(sp.state().pending);
  auto b = sp.take("glued ");
  CHECK(b->text == "glued");
  CHECK_FALSE(b->space_before);
  CHECK(sp.state().pending);  // trailing whitespace separates it from what follows
  CHECK_FALSE(sp.take("\n   \n"));  // whitespace only: nothing to emit, a space stays pending
  auto c = sp.take("next");
  CHECK(c->space_before);
  // Whitespace written as references is kept, never collapsed or trimmed.
  auto d = sp.take("a&#10;&#10;b&#32;");
  CHECK(d->text == "a\n\nb ");
  CHECK_FALSE(d->space_before);
}

TEST_CASE("pml: entities decode, '<' and '&' written escaped come back as characters") {
  Schema s = parse_schema("<schema name=\"e\">if a &lt; b &amp;&amp; c &gt; d: &quot;x&quot; &apos;y&apos; "
                          "&#65;&#x42;&#xe9;</schema>",
                          "e.pml");
  CHECK(text_of(s.body[0]).text == "if a < b && c > d: \"x\" 'y' AB\xC3\xA9");
}

TEST_CASE("pml: comments are ignored and do not split a text run, the XML declaration is accepted") {
  Schema s = parse_schema("<?xml version=\"1.0\"?>\n<!-- scenario: 1 -->\n<schema name=\"c\">one <!-- note --> "
                          "two<!-- x --></schema>\n<!-- trailing -->\n",
                          "c.pml");
  REQUIRE(s.body.size() == 1);
  CHECK(text_of(s.body[0]).text == "one two");
}

TEST_CASE("pml: role tags become turn marks around their content, a self-closing tag only opens") {
  Schema s = parse_schema("<schema name=\"r\"><system> Be brief. </system><user><module name=\"q\">Q</module></user>"
                          "<assistant/></schema>",
                          "r.pml");
  REQUIRE(s.body.size() == 7);
  const RoleMark& open = std::get<RoleMark>(s.body[0].value);
  CHECK(open.role == "system");
  CHECK_FALSE(open.closing);
  CHECK(text_of(s.body[1]).text == "Be brief.");
  CHECK_FALSE(text_of(s.body[1]).space_before);  // a turn's content starts fresh
  CHECK(std::get<RoleMark>(s.body[2].value).closing);
  CHECK(std::get<RoleMark>(s.body[3].value).role == "user");
  CHECK(module_of(s.body[4]).name == "q");
  const RoleMark& user_end = std::get<RoleMark>(s.body[5].value);
  CHECK(user_end.role == "user");
  CHECK(user_end.closing);
  const RoleMark& last = std::get<RoleMark>(s.body[6].value);
  CHECK(last.role == "assistant");
  CHECK_FALSE(last.closing);
}

TEST_CASE("pml: a parameter without length gets the documented default, scaffold= is kept") {
  Schema s = parse_schema("<schema name=\"p\"><module name=\"m\"><parameter name=\"city\" scaffold=\"  Paris \"/>"
                          "</module></schema>",
                          "p.pml");
  const Parameter& p = std::get<Parameter>(module_of(s.body[0]).body[0].value);
  CHECK(p.length == kDefaultParameterLength);
  CHECK(p.scaffold == "Paris");
}

TEST_CASE("pml: src= loads a module's text from a file next to the schema, verbatim but trimmed") {
  auto dir = std::filesystem::temp_directory_path() / ("choreo-pml-src-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "code.py") << "def f(a, b):\n    return a < b & 1\n";
  std::ofstream(dir / "s.pml") << "<schema name=\"s\"><module name=\"code\" src=\"code.py\"/></schema>";
  Schema s = load_schema((dir / "s.pml").string());
  const Module& m = module_of(s.body[0]);
  REQUIRE(m.body.size() == 1);
  // Taken as written (no escaping, inner whitespace kept for code), only trimmed.
  CHECK(text_of(m.body[0]).text == "def f(a, b):\n    return a < b & 1");
  std::filesystem::remove_all(dir);
}

TEST_CASE("pml: a prompt keeps every uncached text run, in order, around and inside imports") {
  Prompt p = parse_prompt(R"(<prompt schema="trip">
  Before. <plan days="3  days"><b/> Inside. </plan> Between. <other/>After.
</prompt>)",
                          SourceLocation{"wf.yaml", 10, 5});
  CHECK(p.schema == "trip");
  std::vector<std::string> texts;
  std::vector<std::string> imports;
  std::function<void(const std::vector<PromptNode>&)> walk = [&](const std::vector<PromptNode>& body) {
    for (const PromptNode& n : body) {
      if (auto* t = std::get_if<Text>(&n.value)) texts.push_back(t->text);
      if (auto* im = std::get_if<Import>(&n.value)) {
        imports.push_back(im->name);
        walk(im->body);
      }
    }
  };
  walk(p.body);
  CHECK(texts == std::vector<std::string>{"Before.", "Inside.", "Between.", "After."});
  CHECK(imports == std::vector<std::string>{"plan", "b", "other"});
  const Import& plan = std::get<Import>(p.body[1].value);
  REQUIRE(plan.arguments.size() == 1);
  CHECK(plan.arguments[0].value == "3 days");  // argument whitespace collapses like text
  // Locations inside an embedded prompt: first line offset by the start column, later lines from column 1.
  CHECK(p.where.to_string() == "wf.yaml:10:5");
  CHECK(plan.where.to_string() == "wf.yaml:11:11");
  const Import& other = std::get<Import>(p.body[p.body.size() - 2].value);
  CHECK(other.name == "other");
  CHECK(other.where.line == 11);
}

TEST_CASE("pml: decode_entities leaves text it did not check as written") {
  CHECK(decode_entities("a &amp; b &unknown; &#0; c") == "a & b &unknown; &#0; c");
}

}  // namespace
}  // namespace choreo::dsl::pml
