// PML layout and prompt plans: positions of modules, unions and parameters, the scaffold each piece is
// encoded over, and the tokenisation rule of docs/pml.md (each piece tokenised alone, no BOS), each checked
// against a recomputation from the vocabulary.

#include <algorithm>
#include <cstdlib>

#include <doctest/doctest.h>

#include "dsl/pml/prompt_parser.h"
#include "dsl/pml/schema_parser.h"
#include "kernels/backend.h"
#include "runtime/model/chat_template.h"
#include "runtime/model/llama.h"
#include "runtime/pml/layout.h"
#include "runtime/pml/prompt_plan.h"
#include "tests/test_models.h"
#include "tests/test_paths.h"

namespace choreo::runtime::pml {
namespace {

using Loaded = testing::LoadedModel;

Loaded& stories() { return testing::stories260k(); }

constexpr const char* kStorySchema = R"(<schema name="story">
Once upon a time.
<module name="cat">There was a cat named <parameter name="name" length="5"/> who liked milk.</module>
<union scaffold="long">
  <module name="short">It was sunny.</module>
  <module name="long">It rained all day and all night.</module>
</union>
The end.
</schema>)";

using Tokens = std::vector<model::Token>;

TEST_CASE("pml layout: modules, parameters and unions get the positions the definitions give") {
  const model::Model& m = *stories().model;
  const model::Vocab& v = m.vocab();
  auto tok = [&](const char* s) { return v.tokenize(s, false); };  // SPM: every piece starts a word
  Layout l = lay_out(dsl::pml::parse_schema(kStorySchema, "story.pml"), m);
  REQUIRE(l.pieces.size() == 7);
  CHECK(l.first_pos == 1);  // after the implicit BOS
  const Tokens once = tok("Once upon a time."), there = tok("There was a cat named"), who = tok("who liked milk."),
               sunny = tok("It was sunny."), rained = tok("It rained all day and all night."), end = tok("The end.");
  CHECK(l.pieces[0].tokens == once);
  CHECK(l.pieces[0].start_pos == 1);
  CHECK(l.pieces[0].module == -1);
  const int cat_start = 1 + int(once.size());
  CHECK(l.pieces[1].tokens == there);
  CHECK(l.pieces[1].start_pos == cat_start);
  // The slot reserves 5 positions, filled with placeholders while encoding.
  CHECK(l.pieces[2].kind == Piece::Kind::Slot);
  CHECK(l.pieces[2].start_pos == cat_start + int(there.size()));
  CHECK(l.pieces[2].tokens == Tokens(5, v.find("<unk>")));
  CHECK(l.pieces[3].tokens == who);
  CHECK(l.pieces[3].start_pos == cat_start + int(there.size()) + 5);
  const int union_start = l.pieces[3].start_pos + int(who.size());
  CHECK(l.modules[0].start_pos == cat_start);
  CHECK(l.modules[0].n_positions == union_start - cat_start);
  // Union members share one start; the union is as long as its longest member.
  CHECK(l.pieces[4].tokens == sunny);
  CHECK(l.pieces[5].tokens == rained);
  CHECK(l.pieces[4].start_pos == union_start);
  CHECK(l.pieces[5].start_pos == union_start);
  REQUIRE(l.unions.size() == 1);
  CHECK(l.unions[0].n_positions == int(std::max(sunny.size(), rained.size())));
  CHECK(l.pieces[6].tokens == end);
  CHECK(l.pieces[6].start_pos == union_start + l.unions[0].n_positions);
  CHECK(l.end_pos == l.pieces[6].start_pos + int(end.size()));
  // Scaffolds: each member sees what precedes the union; later text sees the scaffold member only.
  CHECK(scaffold_of(l, 4) == std::vector<int>{0, 1, 2, 3});
  CHECK(scaffold_of(l, 5) == std::vector<int>{0, 1, 2, 3});
  CHECK(scaffold_of(l, 6) == std::vector<int>{0, 1, 2, 3, 5});
  CHECK(l.modules[2].path == "long");
  CHECK(l.top_modules == std::vector<int>{0, 1, 2});
}

TEST_CASE("pml layout: without scaffold= a union is a gap for the rest of the schema, cache=false pieces are not "
          "scaffold") {
  const model::Model& m = *stories().model;
  Layout l = lay_out(dsl::pml::parse_schema("<schema name=\"s\">A.<union><module name=\"x\">B.</module>"
                                            "<module name=\"y\" cache=\"false\">C c c.</module></union>D.</schema>",
                                            ""),
                     m);
  REQUIRE(l.pieces.size() == 4);
  CHECK_FALSE(l.pieces[2].cached);
  CHECK(scaffold_of(l, 3) == std::vector<int>{0});
}

TEST_CASE("pml prompt plan: a prompt assembled from modules tokenises piece by piece at schema positions") {
  const model::Model& m = *stories().model;
  const model::Vocab& v = m.vocab();
  Layout l = lay_out(dsl::pml::parse_schema(kStorySchema, "story.pml"), m);
  PromptPlan p = plan_prompt(
      l, dsl::pml::parse_prompt("<prompt schema=\"story\"><cat name=\"Tom\"/> <short/> What happened next?</prompt>", {}),
      m);
  // Independently: the documented pieces in position order, the argument at the slot, the text at the end.
  std::vector<std::pair<int, model::Token>> want;
  auto add = [&](int pos, const Tokens& t) {
    for (size_t i = 0; i < t.size(); ++i) want.push_back({pos + int(i), t[i]});
  };
  add(l.pieces[0].start_pos, v.tokenize("Once upon a time.", false));
  add(l.pieces[1].start_pos, v.tokenize("There was a cat named", false));
  const Tokens tom = v.tokenize("Tom", false);
  add(l.pieces[2].start_pos, tom);  // the unused slot positions after it are a gap
  add(l.pieces[3].start_pos, v.tokenize("who liked milk.", false));
  add(l.pieces[4].start_pos, v.tokenize("It was sunny.", false));
  add(l.pieces[6].start_pos, v.tokenize("The end.", false));
  const Tokens question = v.tokenize("What happened next?", false);
  add(l.end_pos, question);
  CHECK(p.positioned_tokens() == want);
  CHECK(p.header == question);  // the last uncached text is the decode's header
  CHECK(p.header_pos == l.end_pos);
  REQUIRE(p.parts.size() == 6);
  CHECK(p.parts[2].kind == PromptPart::Kind::Fresh);  // the argument
  CHECK(p.parts[2].label == "cat.name");
  CHECK(p.parts[0].kind == PromptPart::Kind::Cached);
}

TEST_CASE("pml prompt plan: without uncached text the header is the last token of the last part") {
  const model::Model& m = *stories().model;
  Layout l = lay_out(dsl::pml::parse_schema("<schema name=\"s\"><module name=\"a\">A cat sat.</module></schema>", ""), m);
  PromptPlan p = plan_prompt(l, dsl::pml::parse_prompt("<prompt schema=\"s\"><a/></prompt>", {}), m);
  const Tokens all = m.vocab().tokenize("A cat sat.", false);
  REQUIRE(p.parts.size() == 1);
  CHECK(p.parts[0].tokens == Tokens(all.begin(), all.end() - 1));
  CHECK(p.header == Tokens{all.back()});
  CHECK(p.header_pos == 1 + int(all.size()) - 1);
}

std::string plan_error(const Layout& l, const model::Model& m, const std::string& prompt) {
  try {
    plan_prompt(l, dsl::pml::parse_prompt(prompt, SourceLocation{"p.pml", 1, 1}), m);
  } catch (const InputError& e) {
    return std::string(e.what()) + "\nhint: " + e.hint();
  }
  return "(no error)";
}

void check_error(const std::string& what, const std::string& location, const std::string& message) {
  INFO("error: ", what);
  CHECK(what.rfind(location + ": ", 0) == 0);
  CHECK(what.find(message) != std::string::npos);
}

TEST_CASE("pml errors: prompts that do not fit their schema") {
  const model::Model& m = *stories().model;
  const model::Vocab& v = m.vocab();
  Layout l = lay_out(dsl::pml::parse_schema(kStorySchema, "story.pml"), m);
  // An argument longer than its parameter names both lengths in tokens.
  const std::string longer = "Tom the big grey cat from town";
  const size_t n = v.tokenize(longer, false).size();
  REQUIRE(n > 5);
  check_error(plan_error(l, m, "<prompt schema=\"story\">\n  <cat name=\"" + longer + "\"/></prompt>"), "p.pml:2:8",
              "argument name=\"" + longer + "\" is " + std::to_string(n) + " tokens, longer than parameter 'name' of 5 "
              "tokens");
  check_error(plan_error(l, m, "<prompt schema=\"story\">\n<catt/></prompt>"), "p.pml:2:1",
              "no module 'catt' in schema 'story' — did you mean 'cat'?");
  check_error(plan_error(l, m, "<prompt schema=\"story\">\n<cat nmae=\"x\"/></prompt>"), "p.pml:2:6",
              "module 'cat' has no parameter 'nmae' — did you mean 'name'?");
  check_error(plan_error(l, m, "<prompt schema=\"story\">\n<short/><long/></prompt>"), "p.pml:2:9",
              "'short' and 'long' are members of one union");
  check_error(plan_error(l, m, "<prompt schema=\"story\">\n<cat/><cat/></prompt>"), "p.pml:2:7",
              "module 'cat' is imported twice");
  check_error(plan_error(l, m, "<prompt schema=\"tale\">\n<cat/></prompt>"), "p.pml:1:1",
              "the prompt names schema 'tale' but the schema given is 'story'");
  check_error(plan_error(l, m, "<prompt schema=\"story\"><user>Hi</user></prompt>"), "p.pml:1:24",
              "<user> needs a model with a chat template");
  Layout nested =
      lay_out(dsl::pml::parse_schema("<schema name=\"n\"><module name=\"a\"><module name=\"b\">x</module></module></schema>",
                                     ""),
              m);
  std::string err = plan_error(nested, m, "<prompt schema=\"n\"><b/></prompt>");
  check_error(err, "p.pml:1:20", "no module 'b' in schema 'n'");
  CHECK(err.find("import it inside its parents, as in the path a/b") != std::string::npos);
  // A parameter's scaffold= text must fit its length too (a schema error, found when tokenised).
  try {
    lay_out(dsl::pml::parse_schema("<schema name=\"s\">\n<module name=\"m\"><parameter name=\"p\" length=\"2\" "
                                   "scaffold=\"a very long default value\"/></module></schema>",
                                   "s.pml"),
            m);
    FAIL("no error");
  } catch (const InputError& e) {
    check_error(e.what(), "s.pml:2:18", "the scaffold text of parameter 'p' is");
  }
}

TEST_CASE("pml chat roles: a schema of turns assembles into exactly the model's chat prompt (SmolLM2, ChatML)") {
  Loaded& smol = testing::smollm2();
  const model::Model& m = *smol.model;
  REQUIRE(m.chat_format() == model::ChatFormat::ChatML);
  Layout l = lay_out(dsl::pml::parse_schema(R"(<schema name="chat">
  <system>
    You are a helpful travel planner.
  </system>
  <user>
    <module name="trip">I want to visit Rome for <parameter name="days" length="4"/> days.</module>
  </user>
</schema>)",
                                            "chat.pml"),
                     m);
  PromptPlan p = plan_prompt(l, dsl::pml::parse_prompt("<prompt schema=\"chat\"><trip days=\"3\"/><assistant/></prompt>", {}),
                             m);
  std::string chat = model::render_chat(
      model::ChatFormat::ChatML,
      {{"system", "You are a helpful travel planner."}, {"user", "I want to visit Rome for 3 days."}}, true);
  Tokens want = m.vocab().tokenize(chat, false, true);
  Tokens got;
  for (auto& [pos, token] : p.positioned_tokens()) got.push_back(token);
  CHECK(got == want);
  // Positions are the schema's: the slot keeps its 4 positions though "3" fills one (a gap of 3 remains).
  auto positioned = p.positioned_tokens();
  int gaps = 0;
  for (size_t i = 1; i < positioned.size(); ++i) gaps += positioned[i].first - positioned[i - 1].first - 1;
  CHECK(gaps == 4 - int(m.vocab().tokenize(" 3", false).size()));
}

}  // namespace
}  // namespace choreo::runtime::pml

namespace choreo::runtime::pml {
namespace {

TEST_CASE("pml: the shipped schemas load, lay out for SmolLM2 and accept their example prompts") {
  const char* source = std::getenv("CHOREO_SOURCE_DIR");
  const std::string root = source ? source : ".";
  Loaded& smol = testing::smollm2();
  const model::Model& m = *smol.model;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"travel.pml", "<prompt schema=\"travel\"><trip duration=\"5\"><abroad><kyoto/></abroad></trip>"
                     "<user>Draft a day-by-day plan.</user><assistant/></prompt>"},
      {"code-generation.pml", "<prompt schema=\"code-generation\"><inventory.py/><orders.py/><task><tests/></task>"
                              "<assistant/></prompt>"},
      {"personalization.pml", "<prompt schema=\"personalization\"><age><teen/></age><place><coast/></place>"
                              "<user>Explain how tides work.</user><assistant/></prompt>"},
  };
  for (const auto& [file, prompt_text] : cases) {
    INFO(file);
    Layout l = lay_out(dsl::pml::load_schema(testing::require_file(root + "/workflows/schemas/" + file)), m);
    CHECK(l.end_pos > l.first_pos);
    for (const UnionLayout& u : l.unions) {
      int longest = 0;
      for (int member : u.members) {
        CHECK(l.modules[member].start_pos == u.start_pos);
        longest = std::max(longest, l.modules[member].n_positions);
      }
      CHECK(u.n_positions == longest);
    }
    PromptPlan p = plan_prompt(l, dsl::pml::parse_prompt(prompt_text, {}), m);
    CHECK_FALSE(p.header.empty());
  }
  // src= keeps the code's line breaks: the orders.py module's text holds the file's lines.
  Layout code = lay_out(dsl::pml::load_schema(root + "/workflows/schemas/code-generation.pml"), m);
  for (const ModuleLayout& mod : code.modules)
    if (mod.name == "orders.py")
      CHECK(m.vocab().detokenize(code.pieces[mod.pieces[0]].tokens).find("\n    def add(self, isbn, quantity=1):\n") !=
            std::string::npos);
}

}  // namespace
}  // namespace choreo::runtime::pml
