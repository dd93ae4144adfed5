// One JSON line read the way every JSON-lines input is (runtime/exec/json_line.h): a long list of objects is
// read whole, in time that grows with the line (issue 42, finding 4), and keys given twice are still noted.

#include "runtime/exec/json_line.h"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "dsl/arguments.h"
#include "dsl/workflow_parser.h"
#include "runtime/exec/instances.h"
#include "tests/scratch_dir.h"

namespace choreo::exec {
namespace {

using json = nlohmann::json;

/// `[{},{},...]`: a list of `n` empty objects. Empty, so that a million of them take little memory: reading
/// them costs their allocations, and an object's members cost more of those.
std::string list_of_objects(int n) {
  std::string text = "[";
  text.reserve(size_t(n) * 3 + 1);
  for (int i = 0; i < n; ++i) text += i == 0 ? "{}" : ",{}";
  return text + "]";
}

}  // namespace

// nlohmann's callback parser scans the enclosing list after every object it closes, so this line took minutes
// (200,000 objects took 7 s).
TEST_CASE("a JSON line holding a list of a million objects reads whole, each object as written") {
  constexpr int kObjects = 1000000;
  const JsonLine line = parse_json_line(1, list_of_objects(kObjects));
  REQUIRE(line.json_error.empty());
  CHECK(line.duplicate_key.empty());
  REQUIRE(line.value.is_array());
  CHECK(line.value.size() == size_t(kObjects));
  CHECK(std::all_of(line.value.begin(), line.value.end(),
                    [](const json& element) { return element.is_object() && element.empty(); }));
}

TEST_CASE("keys given twice are noted at any depth, once, and the later value wins as in the plain parser") {
  const std::string text = R"([{"a":1},{"b":{"c":1,"d":2,"c":3}},{"e":1,"e":2}])";
  const JsonLine line = parse_json_line(1, text);
  REQUIRE(line.json_error.empty());
  CHECK(line.duplicate_key == "c");  // the first key given twice
  CHECK(line.value == json::parse(text));
  CHECK(line.value[1]["b"]["c"] == 3);
  // The same key in sibling objects is no duplicate.
  CHECK(parse_json_line(1, R"([{"a":1},{"a":2},{"a":{"a":3}}])").duplicate_key.empty());
}

TEST_CASE("a JSON line that is not JSON names the byte where reading stopped") {
  const JsonLine bad = parse_json_line(4, R"({"a": [1, 2,, 3]})");
  CHECK(!bad.json_error.empty());
  CHECK(bad.json_error_byte == 13);  // the second comma
  CHECK(bad.value.is_null());
  const JsonLine trailing = parse_json_line(4, R"({"a": 1} x)");
  CHECK(!trailing.json_error.empty());
  const JsonLine overflow = parse_json_line(4, R"({"a": 1e999})");
  CHECK(overflow.json_error.find("1e999") != std::string::npos);
  CHECK(overflow.json_error_byte == 7);
}

// The same line as an input row of `run --inputs`: the list reaches the workflow's list input as its JSON
// text.
TEST_CASE("run --inputs: a row whose list input holds a million objects reads, the input equal to the list") {
  constexpr int kObjects = 1000000;
  testing::ScratchDir scratch;
  const dsl::Workflow workflow = dsl::parse_workflow(
      "name: lists\ninputs: {items: list}\nmessages:\n  m: {text: 'x'}\nsteps:\n"
      "  - prefill: {as: p, text: '{{ items }}', parents: [m]}\n",
      "lists.yaml");
  const std::string list = list_of_objects(kObjects);
  const std::string path = (scratch.path / "rows.jsonl").string();
  std::ofstream(path, std::ios::binary) << "{\"items\": " << list << "}\n";
  const std::vector<InputRow> rows = read_input_rows(path, workflow, {});
  REQUIRE(rows.size() == 1);
  const std::string& items = rows[0].arguments.inputs.at("items");
  CHECK(items == list);  // written compact, as nlohmann writes it back
  // As a workflow value, a million elements are past the expression reader's bounds: the error gives the reader's
  // reason instead of only "must be a list", and quotes the text cut short.
  const std::string error =
      testing::input_error_text([&] { dsl::convert_argument(items, dsl::ValueType::List, "input `items`"); });
  CHECK(error.find("must be a list") != std::string::npos);
  CHECK(error.find("too long") != std::string::npos);
  CHECK(error.size() < 1000);
}

}  // namespace choreo::exec
