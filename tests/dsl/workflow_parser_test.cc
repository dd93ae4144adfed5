// Workflow files (dsl/workflow_parser): every shipped workflow parses and every AST node points inside its
// file; every malformed workflow is rejected with the intended message at the exact line:col of the culprit.

#include "dsl/workflow_parser.h"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "dsl/expr/value.h"
#include "dsl/yaml_errors.h"

namespace choreo::dsl {
namespace {

std::filesystem::path source_dir() {
  const char* src = std::getenv("CHOREO_SOURCE_DIR");
  return src ? std::filesystem::path(src) : std::filesystem::current_path();
}

/// The error a workflow text raises; fails the test if it parses.
InputError error_of(const std::string& yaml) {
  try {
    parse_workflow(yaml, "w.yaml");
  } catch (const InputError& e) {
    return e;
  }
  FAIL("expected an InputError for:\n", yaml);
  return InputError("unreachable");
}

/// Parses `yaml` expecting an error at line:col whose message contains `message` (and hint contains `hint`).
void expect_error(const std::string& yaml, int line, int col, const std::string& message,
                  const std::string& hint = {}) {
  InputError e = error_of(yaml);
  INFO("yaml:\n", yaml, "\nrendered:\n", e.render());
  CHECK(e.where().file == "w.yaml");
  CHECK(e.where().line == line);
  CHECK(e.where().col == col);
  CHECK(e.message().find(message) != std::string::npos);
  if (!hint.empty()) CHECK(e.hint().find(hint) != std::string::npos);
  if (line > 0) {
    // The quoted line is that line of the input, so the caret lands on the culprit.
    std::istringstream in(yaml);
    std::string quoted;
    for (int l = 0; l < line; ++l) std::getline(in, quoted);
    CHECK(e.quoted_line() == quoted);
    CHECK(e.render().find("^") != std::string::npos);
  }
}

const std::string kHead = "name: t\nmessages:\n  start: {role: user, text: hi}\n";

// ---- walking the AST: every location is a real place in the file -----------------------------------

struct LocationAudit {
  const Workflow& w;
  std::vector<std::string> lines;
  int checked = 0;

  explicit LocationAudit(const Workflow& workflow) : w(workflow) {
    std::istringstream in(w.source);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
  }

  void at(const SourceLocation& where, const std::string& what) {
    INFO(w.file, ": ", what, " at ", where.to_string());
    ++checked;
    CHECK(where.file == w.file);
    REQUIRE(where.line >= 1);
    REQUIRE(where.line <= static_cast<int>(lines.size()));
    CHECK(where.col >= 1);
    CHECK(where.col <= static_cast<int>(lines[where.line - 1].size()) + 1);
  }
  /// A text's location must also hold the text's first character (for one-line texts, the whole text).
  void text(const Text& t, const std::string& what) {
    at(t.where, what);
    if (t.value.empty() || t.style == ScalarStyle::Folded) return;
    const std::string& line = lines[t.where.line - 1];
    std::string first_line = t.value.substr(0, t.value.find('\n'));
    if (t.style == ScalarStyle::DoubleQuoted && first_line.find('\\') != std::string::npos) return;
    if (t.style == ScalarStyle::DoubleQuoted) first_line = first_line.substr(0, first_line.find('\n'));
    INFO(what, ": `", t.value, "` at ", t.where.to_string(), " in line `", line, "`");
    CHECK(line.compare(t.where.col - 1, first_line.size(), first_line) == 0);
  }
  void opt(const std::optional<Text>& t, const std::string& what) {
    if (t) text(*t, what);
  }
  void sampling(const Sampling& s) {
    auto int_setting = [&](const std::optional<IntSetting>& x) {
      if (x) at(x->where, "int setting");
    };
    auto float_setting = [&](const std::optional<FloatSetting>& x) {
      if (x) at(x->where, "float setting");
    };
    float_setting(s.temperature);
    float_setting(s.top_p);
    int_setting(s.top_k);
    int_setting(s.max_tokens);
    int_setting(s.seed);
    if (s.stop)
      for (const Text& t : *s.stop) text(t, "stop");
  }
  void loop(const Loop& l) {
    at(l.where, "loop");
    text(l.variable, "loop variable");
    text(l.iterable, "loop iterable");
  }
  void steps(const std::vector<Step>& list) {
    for (const Step& s : list) {
      if (auto* c = std::get_if<Call>(&s.node)) {
        at(c->where, "call");
        text(c->as.text, "as");
        text(c->as.base, "as base");
        for (const Text& i : c->as.indices) text(i, "as index");
        opt(c->text, "text");
        opt(c->message, "message");
        opt(c->header, "header");
        opt(c->agent, "agent");
        opt(c->private_to, "private");
        opt(c->model, "model");
        opt(c->when, "when");
        for (const Parent& p : c->parents) {
          at(p.where, "parent");
          text(p.ref, "parent ref");
          if (p.at) at(p.at->where, "at");
        }
        if (c->new_offset) at(c->new_offset->where, "new_offset");
        if (c->for_each) loop(*c->for_each);
        sampling(c->sampling);
      } else if (auto* r = std::get_if<Repeat>(&s.node)) {
        at(r->where, "repeat");
        loop(r->loop);
        opt(r->until, "until");
        opt(r->when, "when");
        steps(r->steps);
      } else if (auto* l = std::get_if<Let>(&s.node)) {
        at(l->where, "let");
        for (const Binding& b : l->bindings) {
          text(b.name, "let name");
          text(b.value, "let value");
        }
      } else if (auto* sel = std::get_if<Select>(&s.node)) {
        at(sel->where, "select");
        text(sel->as, "select as");
        text(sel->choice, "select choice");
      }
    }
  }
  void all() {
    text(w.name, "name");
    opt(w.description, "description");
    for (const Input& i : w.inputs) {
      at(i.where, "input");
      text(i.name, "input name");
    }
    for (const Param& p : w.params) {
      at(p.where, "param");
      at(p.value.where, "param value");
    }
    opt(w.model, "model");
    sampling(w.sampling);
    for (const Agent& a : w.agents) {
      at(a.where, "agent");
      opt(a.description, "agent description");
      opt(a.color, "agent color");
    }
    for (const Message& m : w.messages) {
      at(m.where, "message");
      opt(m.text, "message text");
      opt(m.field, "message field");
      opt(m.prompt, "message prompt");
      opt(m.private_to, "message private");
    }
    steps(w.steps);
    opt(w.output, "output");
  }
};

TEST_CASE("workflow: every file in workflows/ parses and every AST location is inside the file") {
  std::filesystem::path dir = source_dir() / "workflows";
  REQUIRE_MESSAGE(std::filesystem::is_directory(dir), "set CHOREO_SOURCE_DIR to the repository root");
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".yaml") continue;
    ++files;
    INFO(entry.path().string());
    Workflow w;
    try {
      w = load_workflow(entry.path().string());
    } catch (const InputError& e) {
      FAIL(e.render());
    }
    CHECK(w.name.value == entry.path().stem().string());
    CHECK(!w.steps.empty());
    LocationAudit audit(w);
    audit.all();
    CHECK(audit.checked > 10);
  }
  CHECK(files >= 7);
}

TEST_CASE("workflow: texts keep their exact source location, including `|` blocks and quotes") {
  std::string yaml =
      "name: t\n"                              // 1
      "messages:\n"                            // 2
      "  start:\n"                             // 3
      "    role: user\n"                       // 4
      "    text: |\n"                          // 5
      "\n"                                     // 6
      "      Solve {{ problem }}\n"            // 7
      "        indented {{ x }}\n"             // 8
      "steps:\n"                               // 9
      "  - repeat: 'r in range(1, rounds)'\n"  // 10
      "    until: \"done(r)\"\n"               // 11
      "    steps:\n"                           // 12
      "      - decode: {as: \"a[r][i]\", for: i in range(3), header: \"H\", parents: [start, \"a[r-1][j] for "
      "j in range(3)\"]}\n";
  Workflow w = parse_workflow(yaml, "w.yaml");
  const Text& text = *w.messages.at(0).text;
  CHECK(text.style == ScalarStyle::Literal);
  CHECK(text.value == "\nSolve {{ problem }}\n  indented {{ x }}\n");
  CHECK(text.where.line == 7);
  CHECK(text.where.col == 7);
  // `{{ x }}` on line 8: after "  indented " (11 characters) from the block's column 7.
  size_t x = text.value.find("{{ x");
  CHECK(locate(text, x).line == 8);
  CHECK(locate(text, x).col == 18);
  CHECK(locate(text, text.value.find("{{ problem")).col == 13);

  const auto& repeat = std::get<Repeat>(w.steps.at(0).node);
  CHECK(repeat.loop.variable.value == "r");
  CHECK(repeat.loop.variable.where.line == 10);
  CHECK(repeat.loop.variable.where.col == 14);
  CHECK(repeat.loop.iterable.value == "range(1, rounds)");
  CHECK(repeat.loop.iterable.where.col == 19);
  CHECK(repeat.until->where.col == 13);
  const auto& call = std::get<Call>(repeat.steps.at(0).node);
  CHECK(call.kind == CallKind::Decode);
  CHECK(call.as.base.value == "a");
  REQUIRE(call.as.indices.size() == 2);
  CHECK(call.as.indices[1].value == "i");
  CHECK(call.as.indices[1].where.col == 28);
  CHECK(call.for_each->iterable.value == "range(3)");
  REQUIRE(call.parents.size() == 2);
  CHECK(call.parents[0].form == ParentForm::Name);
  CHECK(call.parents[1].form == ParentForm::Comprehension);
  CHECK(call.parents[1].base == "a");
  CHECK(call.parents[1].ref.where.col == 84);
}

TEST_CASE("workflow: scalars are typed by the schema, not by YAML's guessing") {
  Workflow w =
      parse_workflow(kHead +
                         "params: {n: 3, t: 0.5, flag: true, label: \"3\", words: [a, 2], long: {default: "
                         "off_label, description: d}}\n"
                         "sampling: {temperature: 0, seed: \"base + 1\", stop: \"END\"}\n"
                         "steps:\n  - prefill: {as: x, text: 42, parents: [start]}\n",
                     "w.yaml");
  REQUIRE(w.params.size() == 6);
  CHECK(w.params[0].value.type == ValueType::Int);
  CHECK(w.params[0].value.int_value == 3);
  CHECK(w.params[1].value.type == ValueType::Float);
  CHECK(w.params[1].value.float_value == 0.5);
  CHECK(w.params[2].value.type == ValueType::Bool);
  CHECK(w.params[3].value.type == ValueType::String);  // quoted: text, whatever it looks like
  CHECK(w.params[4].value.type == ValueType::List);
  CHECK(w.params[4].value.items.at(1).type == ValueType::Int);
  CHECK(w.params[5].value.text == "off_label");
  CHECK(std::get<double>(w.sampling.temperature->value) == 0.0);
  CHECK(std::get<Text>(w.sampling.seed->value).value == "base + 1");
  CHECK(w.sampling.stop->at(0).value == "END");
  // A number where text is expected is its literal source text.
  CHECK(std::get<Call>(w.steps.at(0).node).text->value == "42");
}

TEST_CASE("workflow: malformed files name the culprit's line and column") {
  SUBCASE("YAML syntax error") { expect_error("name: t\nsteps: [a, b\n", 2, 13, "YAML syntax error"); }
  SUBCASE("bad indentation") {
    expect_error("name: t\nsteps:\n  - decode: {as: a}\n   x: 1\n", 4, 4, "YAML syntax error");
  }
  SUBCASE("empty file") {
    InputError e = error_of("  \n\n");
    CHECK(e.message() == "workflow file is empty");
    CHECK(e.where().file == "w.yaml");
  }
  SUBCASE("comments only") {
    InputError e = error_of("# nothing here\n");
    CHECK(e.message() == "workflow file is empty");
  }
  SUBCASE("not UTF-8") { expect_error("name: t\ndescription: caf\xe9\n", 2, 17, "invalid UTF-8 byte 0xE9"); }
  SUBCASE("columns count characters, not bytes") {
    expect_error("name: t\ndescription: \xc3\xa9t\xc3\xa9\nstepz: []\n", 3, 1, "unknown key `stepz`",
                 "did you mean \'steps\'?");
  }
  SUBCASE("top level is a list") { expect_error("- name: t\n", 1, 1, "a workflow file is a map"); }
  SUBCASE("unknown top-level key with suggestion") {
    expect_error(kHead + "sampeling: {temperature: 0}\nsteps: []\n", 4, 1,
                 "unknown key `sampeling` in top level", "did you mean \'sampling\'?");
  }
  SUBCASE("unknown key inside a decode with suggestion") {
    expect_error(kHead + "steps:\n  - decode: {as: a, role: assistant, parents: [start], max_token: 5}\n", 5,
                 56, "unknown key `max_token` in decode", "did you mean \'max_tokens\'?");
  }
  SUBCASE("`if` is written `when`") {
    expect_error(kHead + "steps:\n  - decode: {as: a, role: assistant, if: \"x > 1\"}\n", 5, 38,
                 "unknown key `if`", "when: EXPR");
  }
  SUBCASE("duplicate key") {
    expect_error("name: t\nsteps: []\nname: u\n", 3, 1, "duplicate key `name`", "line 1");
  }
  SUBCASE("yes/no is not a boolean") {
    expect_error(kHead + "params:\n  verbose: yes\nsteps: []\n", 5, 12, "`yes` is not a boolean",
                 "exactly `true` or `false`");
  }
  SUBCASE("a map where a list is expected") {
    expect_error(kHead + "steps:\n  decode: {as: a}\n", 5, 3, "`steps` must be a list, found a map");
  }
  SUBCASE("a list where text is expected") {
    expect_error("name: t\ndescription: [a, b]\nsteps: []\n", 2, 14, "`description` must be a single value");
  }
  SUBCASE("parents must be a list") {
    expect_error(kHead + "steps:\n  - decode: {as: a, role: user, parents: start}\n", 5, 42,
                 "`parents` must be a list", "parents: [question");
  }
  SUBCASE("a number where a whole number is expected") {
    expect_error(kHead + "steps:\n  - decode: {as: a, role: user, max_tokens: 2.5}\n", 5, 45,
                 "`max_tokens` must be a whole number");
  }
  SUBCASE("temperature out of range") {
    expect_error(kHead + "sampling:\n  temperature: -1\nsteps: []\n", 5, 16,
                 "`temperature` must be in [0, 100]");
  }
  SUBCASE("missing `as`") {
    expect_error(kHead + "steps:\n  - decode: {role: assistant, parents: [start]}\n", 5, 13,
                 "`decode` is missing `as:`");
  }
  SUBCASE("missing steps") { expect_error(kHead, 1, 1, "`workflow` is missing `steps:`"); }
  SUBCASE("empty steps") { expect_error(kHead + "steps: []\n", 4, 1, "`steps` is empty"); }
  SUBCASE("unknown parent with suggestion") {
    expect_error(kHead + "steps:\n  - decode: {as: a, role: assistant, parents: [strat]}\n", 5, 48,
                 "unknown name `strat`", "did you mean \'start\'?");
  }
  SUBCASE("parent defined later") {
    expect_error(kHead +
                     "steps:\n  - decode: {as: a, role: assistant, parents: [b]}\n"
                     "  - decode: {as: b, role: assistant, parents: [start]}\n",
                 5, 48, "`b` is defined later (line 6)", "free of cycles");
  }
  SUBCASE("a call cannot be its own parent") {
    expect_error(kHead + "steps:\n  - decode: {as: a, role: assistant, parents: [start, a]}\n", 5, 55,
                 "`a` cannot be a parent of the call that defines it");
  }
  SUBCASE("unknown base of an indexed parent") {
    expect_error(kHead + "steps:\n  - decode: {as: a, role: assistant, parents: [\"anser[0]\"]}\n", 5, 49,
                 "unknown name `anser`");
  }
  SUBCASE("an input is not a message") {
    expect_error("name: t\ninputs: {q: string}\nsteps:\n  - decode: {as: a, role: user, parents: [q]}\n", 4,
                 43, "`q` is an input, not a message");
  }
  SUBCASE("duplicate `as` name") {
    expect_error(kHead +
                     "steps:\n  - decode: {as: a, role: assistant, parents: [start]}\n"
                     "  - decode: {as: a, role: assistant, parents: [start]}\n",
                 6, 18, "duplicate `as` name `a`", "line 5");
  }
  SUBCASE("a step name clashing with a message") {
    expect_error(kHead + "steps:\n  - prefill: {as: start, text: x}\n", 5, 19,
                 "`start` is already defined as a message");
  }
  SUBCASE("one name with different numbers of indices") {
    expect_error(kHead +
                     "steps:\n  - decode: {as: \"a[i]\", for: i in range(2), role: user}\n"
                     "  - decode: {as: \"a[0][1]\", role: user}\n",
                 6, 19, "`a` has 2 indices here but 1 at line 5");
  }
  SUBCASE("a fan-out must index its name by the loop variable") {
    expect_error(kHead + "steps:\n  - decode: {as: a, for: i in range(2), role: user}\n", 5, 18,
                 "fan-out over `i` writes `a` in every branch", "a[i]");
  }
  SUBCASE("`{{` in until") {
    expect_error(kHead +
                     "steps:\n  - repeat: r in range(3)\n    until: \"{{ done }}\"\n"
                     "    steps:\n      - decode: {as: \"a[r]\", role: user}\n",
                 6, 13, "`{{` in `until`", "without `{{ }}`");
  }
  SUBCASE("`{{` in a block-scalar let value points into the block") {
    expect_error(kHead + "steps:\n  - let:\n      best: |\n        pick({{ x }})\n", 7, 14, "`{{` in `best`");
  }
  SUBCASE("private to an unknown agent") {
    expect_error(
        "name: t\nagents: [alice, bob]\nmessages:\n  m: {text: hi, private: alcie}\nsteps:\n"
        "  - decode: {as: a, role: user, parents: [m]}\n",
        4, 26, "unknown agent `alcie`", "did you mean \'alice\'?");
  }
  SUBCASE("private with no agents declared") {
    expect_error(kHead + "steps:\n  - decode: {as: a, role: user, private: bob}\n", 5, 42,
                 "no agents are declared", "agents: [bob]");
  }
  SUBCASE("bad for header") {
    expect_error(kHead + "steps:\n  - decode: {as: \"a[i]\", for: \"range(3)\", role: user}\n", 5, 32,
                 "`for` takes `NAME in EXPR`");
  }
  SUBCASE("bad repeat header") {
    expect_error(kHead + "steps:\n  - repeat: 3\n    steps:\n      - decode: {as: a, role: user}\n", 5, 13,
                 "`repeat` takes `NAME in EXPR`", "bounds the loop");
  }
  SUBCASE("negative new_offset literal") {
    expect_error(kHead + "steps:\n  - prefill: {as: a, text: x, new_offset: -4}\n", 5, 43,
                 "`new_offset` must be at least 0", "counted from 0");
  }
  SUBCASE("negative `at` of a parent") {
    expect_error(kHead + "steps:\n  - decode: {as: a, role: user, parents: [{ref: start, at: -1}]}\n", 5, 60,
                 "`at` must be at least 0");
  }
  SUBCASE("empty header") {
    expect_error(kHead + "steps:\n  - decode: {as: a, header: \"\", parents: [start]}\n", 5, 21,
                 "decode `header` is empty");
  }
  SUBCASE("decode without header or role") {
    expect_error(kHead + "steps:\n  - decode: {as: a, parents: [start]}\n", 5, 13,
                 "needs a `header:` or a `role:`");
  }
  SUBCASE("prefill with both text and message") {
    expect_error(kHead + "steps:\n  - prefill: {as: a, text: x, message: start}\n", 5, 14,
                 "exactly one of `text:` or `message:`");
  }
  SUBCASE("prefill of an undeclared message") {
    expect_error(kHead + "steps:\n  - prefill: {as: a, message: stat}\n", 5, 31,
                 "`message: stat` is not a declared", "did you mean \'start\'?");
  }
  SUBCASE("unknown role with suggestion") {
    expect_error(kHead + "steps:\n  - decode: {as: a, role: asistant}\n", 5, 27, "unknown role `asistant`",
                 "did you mean \'assistant\'?");
  }
  SUBCASE("two kinds in one step") {
    expect_error(kHead + "steps:\n  - decode: {as: a, role: user}\n    prefill: {as: b, text: x}\n", 6, 5,
                 "a step has one kind");
  }
  SUBCASE("for placed next to decode instead of inside it") {
    expect_error(kHead + "steps:\n  - decode: {as: \"a[i]\", role: user}\n    for: i in range(2)\n", 6, 5,
                 "`for` does not belong next to `decode:`", "inside the `decode:` map");
  }
  SUBCASE("until on a call") {
    expect_error(kHead + "steps:\n  - decode: {as: a, role: user, until: done}\n", 5, 33,
                 "unknown key `until`", "belongs next to `repeat:`");
  }
  SUBCASE("invalid name") {
    expect_error("name: my-flow\nsteps: []\n", 1, 7, "`my-flow` is not a valid name");
  }
  SUBCASE("bad `as` form") {
    expect_error(kHead + "steps:\n  - decode: {as: \"a[i\", role: user}\n", 5, 20,
                 "`as` takes a name or an indexed");
  }
  SUBCASE("loop variable hiding a param") {
    expect_error(
        kHead + "params: {n: 2}\nsteps:\n  - decode: {as: \"a[n]\", for: n in range(2), role: user}\n", 6, 31,
        "loop variable `n` hides a parameter");
  }
  SUBCASE("message without a source") {
    expect_error("name: t\nmessages:\n  m: {role: user}\nsteps: []\n", 3, 3, "needs exactly one of `text:`");
  }
  SUBCASE("unknown input type") {
    expect_error("name: t\ninputs: {q: strng}\nsteps: []\n", 2, 13, "unknown type `strng`",
                 "did you mean \'string\'?");
  }
  SUBCASE("second YAML document") {
    expect_error("name: t\nsteps: []\n---\nname: u\n", 4, 1, "one YAML document");
  }
  SUBCASE("nesting too deep is refused before yaml-cpp sees it") {
    expect_error("name: t\nsteps: " + std::string(100, '[') + "\n", 2, 72, "nested too deeply");
  }
  // Block lists (`- - x`) pass the bracket bound; the value bound is checked at the list too deep (it once
  // was an error without file:line: issue 42, finding 12).
  SUBCASE("a param's value nested past the value bound by block lists") {
    std::string dashes;
    for (int i = 0; i < expr::kMaxValueDepth + 6; ++i) dashes += "- ";
    expect_error("name: t\nparams:\n  p:\n    " + dashes + "1\nsteps: []\n", 4, 5 + 2 * expr::kMaxValueDepth,
                 "the value of `p` nests lists more than 64 levels deep");
  }
  // Too many nodes is blamed on aliases only when the file has some.
  SUBCASE("too many nodes, written out or made by aliases") {
    std::string items;
    for (int i = 0; i < 200001; ++i) items += i ? ", m" : "m";
    const InputError written =
        error_of(kHead + "steps:\n  - decode: {as: a, header: x, parents: [" + items + "]}\n");
    CHECK(written.message().find("has more than 200000 keys, values and list items") != std::string::npos);
    CHECK(written.message().find("alias") == std::string::npos);
    CHECK(written.where().line == 5);
    std::string bomb =
        kHead + "steps:\n  - repeat: \"r in range(1)\"\n    steps: &s0 [{decode: {as: b, header: x}}]\n";
    for (int i = 1; i < 20; ++i)
      bomb += fmt::format(
          "  - repeat: \"r{0} in range(1)\"\n    steps: &s{0} [{{repeat: \"q in range(1)\", steps: *s{1}}}, "
          "{{repeat: \"p in range(1)\", steps: *s{1}}}]\n",
          i, i - 1);
    const InputError expanded = error_of(bomb);
    CHECK(expanded.message().find("too large after expanding YAML aliases") != std::string::npos);
  }
}

TEST_CASE("workflow: KV retention hints are literals, checked where they are written") {
  const Workflow w = parse_workflow(
      "name: t\nmessages:\n  doc: {role: system, text: hi, pin: true}\nsteps:\n"
      "  - decode: {as: a, role: assistant, parents: [doc], priority: -5, ttl: 30}\n"
      "  - prefill: {as: b, text: x, release: true}\n",
      "w.yaml");
  CHECK(w.messages.at(0).retention.pin);
  const Call& a = std::get<Call>(w.steps.at(0).node);
  CHECK(a.retention.priority == -5);
  CHECK(a.retention.ttl_s == 30);
  CHECK(std::get<Call>(w.steps.at(1).node).retention.release);
  expect_error(kHead + "steps:\n  - decode: {as: a, role: assistant, priority: high}\n", 5, 48,
               "`priority` must be a whole number from -1000 to 1000", "priority: 10");
  expect_error(kHead + "steps:\n  - decode: {as: a, role: assistant, ttl: 0}\n", 5, 43,
               "`ttl` must be a whole number from 1 to 31536000 seconds");
  expect_error(kHead + "steps:\n  - decode: {as: a, role: assistant, priority: \"{{ k }}\"}\n", 5, 49,
               "`priority` must be a whole number");
  expect_error(kHead + "steps:\n  - prefill: {as: a, text: x, pin: true, release: true}\n", 5, 42,
               "`pin: true` and `release: true` contradict each other");
  expect_error("name: t\nmessages:\n  doc: {text: hi, pin: yes}\nsteps: []\n", 3, 24, "`yes` is not a boolean");
}

TEST_CASE("workflow: a missing file is an InputError naming it") {
  try {
    load_workflow("/nonexistent/flow.yaml");
    FAIL("expected an error");
  } catch (const InputError& e) {
    CHECK(e.where().file == "/nonexistent/flow.yaml");
  }
}

TEST_CASE("workflow: did-you-mean picks the nearest key only when it is near") {
  std::vector<std::string> keys = {"temperature", "top_p", "top_k", "max_tokens"};
  CHECK(did_you_mean("tempreature", keys) == "did you mean 'temperature'?");
  CHECK(did_you_mean("zzz", keys).empty());
}

}  // namespace
}  // namespace choreo::dsl

namespace choreo::dsl {
namespace {

TEST_CASE("workflow: loop headers and comprehension clauses are split by hand, exactly") {
  auto h = split_loop_header("  r in range(1, rounds) ");
  REQUIRE(h);
  CHECK(h->variable == "r");
  CHECK(h->variable_offset == 2);
  CHECK(h->iterable == "range(1, rounds)");
  CHECK(h->iterable_offset == 7);
  CHECK(split_loop_header("x inside") == std::nullopt);  // `in` must be a separate word
  CHECK(split_loop_header("x in[1, 2]")->iterable == "[1, 2]");
  CHECK(split_loop_header("index in [1, 2]")->variable == "index");
  CHECK(!split_loop_header("range(3)"));
  CHECK(!split_loop_header("i in "));
  CHECK(!split_loop_header("2 in x"));
  CHECK(comprehension_variables("m for t in range(r) for m in [a[t], b[t]]") ==
        std::vector<std::string>{"t", "m"});
  CHECK(comprehension_variables("answer[r-1][j] for j in range(n) if j != i") ==
        std::vector<std::string>{"j"});
  CHECK(comprehension_variables("format(x)").empty());
  CHECK(comprehension_variables("before_for_x in y").empty());
}

TEST_CASE("workflow: megabyte-long scalars are handled without recursion") {
  std::string long_name(2'000'000, 'a');
  std::string yaml =
      "name: t\nmessages:\n  start: {text: hi}\nsteps:\n  - decode: {as: x, role: user, parents: [\"" +
      long_name + " for j in y\", " + long_name + "]}\n";
  InputError e = error_of(yaml);
  CHECK(e.where().line == 5);
  CHECK(e.message().find("unknown name") != std::string::npos);
}

}  // namespace
}  // namespace choreo::dsl
