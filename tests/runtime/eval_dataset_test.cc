// Dataset loaders, shards and input maps (runtime/eval/dataset.h, selection.h): the shared data files load
// with the fields the issue names, bad data is reported with its line, and shards partition the rows.

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "common/error.h"
#include "runtime/eval/dataset.h"
#include "runtime/eval/math_answer.h"
#include "runtime/eval/selection.h"
#include "tests/test_paths.h"

namespace choreo::eval {
namespace {

/// A file in a fresh temporary directory, removed with it.
struct TempFile {
  std::filesystem::path dir, path;
  TempFile(const std::string& name, const std::string& text) {
    dir = std::filesystem::temp_directory_path() / ("choreo_eval_data_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    path = dir / name;
    std::ofstream(path, std::ios::binary) << text;
  }
  ~TempFile() { std::filesystem::remove_all(dir); }
};

/// The InputError that loading `text` raises (failing the test when none is raised).
InputError load_error(const std::string& name, const std::string& text,
                      std::optional<DataFormat> format = {}) {
  TempFile file(name, text);
  try {
    load_dataset(file.path.string(), format);
  } catch (const InputError& e) {
    return e;
  }
  FAIL("no InputError for ", text);
  return InputError("unreachable");
}

TEST_CASE("eval dataset: MATH-500 rows carry problem, gold answer, subject and level") {
  const Dataset d = load_dataset(testing::shared_file("data/math500_test.jsonl"));
  CHECK(d.format == DataFormat::math);
  CHECK(d.metric == Metric::math);
  REQUIRE(d.rows.size() == 500);
  const Row& first = d.rows[0];
  CHECK(first.id == "test/precalculus/807.json");
  CHECK(first.gold == std::vector<std::string>{"\\left( 3, \\frac{\\pi}{2} \\right)"});
  CHECK(first.subject == "Precalculus");
  CHECK(first.level == "2");
  CHECK(first.line == 1);
  CHECK(first.fields.at("problem").starts_with("Convert the point $(0,3)$"));
  // The gold `answer` is the boxed answer of the row's own solution under the official rules, for all but
  // a handful of rows whose solutions box something longer.
  int agree = 0;
  for (const Row& row : d.rows)
    agree += is_equiv(extract_boxed_answer(row.fields.at("solution")), row.gold[0]) ? 1 : 0;
  CHECK(agree >= 490);
}

TEST_CASE("eval dataset: the MATH test set's gold is the last \\boxed{} of the solution") {
  const Dataset d = load_dataset(testing::shared_file("data/math_test_5000.jsonl"));
  CHECK(d.format == DataFormat::math);
  REQUIRE(d.rows.size() == 5000);
  CHECK(d.rows[0].id == "0");
  CHECK(d.rows[0].gold == std::vector<std::string>{"2"});
  CHECK(d.rows[0].subject == "Algebra");
  CHECK(d.rows[0].level == "3");
  std::set<std::string> levels;
  for (const Row& row : d.rows) levels.insert(row.level);
  CHECK(levels == std::set<std::string>{"1", "2", "3", "4", "5"});
}

TEST_CASE("eval dataset: the MuSiQue sample gives question, passages and answers") {
  const Dataset d = load_dataset(testing::shared_file("data/cacheblend_musique_s.json"));
  CHECK(d.format == DataFormat::musique);
  CHECK(d.metric == Metric::qa_f1);
  REQUIRE(d.rows.size() == 150);
  const Row& first = d.rows[0];
  CHECK(first.fields.at("question") == "Where was the author of Hannibal and Scipio educated at?");
  CHECK(first.gold == std::vector<std::string>{"Exeter College"});
  CHECK(first.fields.at("n_passages") == "10");
  CHECK(first.fields.at("passage_0").starts_with("thriller television series developed by bryan fuller"));
  CHECK(first.fields.count("passage_9") == 1);
  CHECK(first.line == 2);  // the row's "{" is on the file's second line
  CHECK(d.rows[1].line > first.line);
}

TEST_CASE("eval dataset: LongBench files keep answers, classes, dataset and its metric") {
  const Dataset qasper = load_dataset(testing::shared_file("data/longbench/qasper.jsonl"));
  CHECK(qasper.format == DataFormat::longbench);
  CHECK(qasper.metric == Metric::qa_f1);
  CHECK(qasper.rows.size() == 46);
  CHECK(qasper.rows[0].id == "db6c4d611b78c840972b57ee0b245003566b982feaff1084");
  CHECK(qasper.rows[0].fields.at("input") == "What is the GhostVLAD approach?");
  CHECK(qasper.rows[0].gold.size() >= 2);
  CHECK(qasper.rows[0].dataset == "qasper");
  const Dataset news = load_dataset(testing::shared_file("data/longbench/multi_news.jsonl"));
  CHECK(news.metric == Metric::rouge_l);
  CHECK(news.rows.size() == 200);
}

TEST_CASE("eval dataset: bad data names the file and line") {
  InputError malformed =
      load_error("a.jsonl", "{\"problem\": \"p\", \"answer\": \"1\"}\n\n{\"problem\": oops}\n");
  CHECK(malformed.where().line == 3);
  CHECK(malformed.where().col > 0);
  InputError missing = load_error("b.jsonl", "{\"problem\": \"p\", \"answer\": \"1\"}\n{\"answer\": \"2\"}\n",
                                  DataFormat::math);
  CHECK(missing.where().line == 2);
  CHECK(std::string(missing.what()).find("\"problem\"") != std::string::npos);
  CHECK(load_error("c.jsonl", "").message().find("no rows") != std::string::npos);
  CHECK(load_error("d.jsonl", "\n  \n").message().find("no rows") != std::string::npos);
  InputError unboxed = load_error("e.jsonl", "{\"problem\": \"p\", \"solution\": \"it is 4\"}\n");
  CHECK(unboxed.where().line == 1);
  InputError twice =
      load_error("f.jsonl", "{\"id\": 1, \"answer\": \"x\"}\n{\"id\": 1, \"answer\": \"y\"}\n");
  CHECK(twice.where().line == 2);
  InputError not_object = load_error("g.jsonl", "[1, 2]\n", DataFormat::jsonl);
  CHECK(not_object.where().line == 1);
  InputError musique = load_error("h.json",
                                  "[\n {\"question\": \"q\", \"answers\": [\"a\"], \"ctxs\": []},\n"
                                  " {\"answers\": [\"a\"], \"ctxs\": []}\n]\n");
  CHECK(musique.where().line == 3);
  InputError musique_json = load_error("i.json", "[\n {\"question\": \"q\",\n ]\n");
  CHECK(musique_json.where().line == 3);
  CHECK_THROWS_AS(load_dataset("/nonexistent/data.jsonl"), InputError);
  CHECK_THROWS_AS(parse_format("longbnch"), InputError);
}

TEST_CASE("eval dataset: shards partition the limited rows, deterministically") {
  std::vector<Row> rows(11);
  for (size_t i = 0; i < rows.size(); ++i) rows[i].id = std::to_string(i);
  for (int count = 1; count <= 5; ++count) {
    std::multiset<std::string> seen;
    for (int index = 0; index < count; ++index)
      for (const Row& row : select_rows(rows, 7, Shard{index, count})) seen.insert(row.id);
    CHECK(seen == std::multiset<std::string>{"0", "1", "2", "3", "4", "5", "6"});
  }
  const std::vector<Row> second = select_rows(rows, -1, parse_shard("1/3"));
  REQUIRE(second.size() == 4);
  CHECK(second[0].id == "1");
  CHECK(second[3].id == "10");
  CHECK(in_shard(4, Shard{0, 2}));
  CHECK_FALSE(in_shard(5, Shard{0, 2}));
  for (const char* bad : {"2/2", "a/b", "1", "-1/2", "0/0", "1/", "/2", "0/2x"})
    CHECK_THROWS_AS(parse_shard(bad), InputError);
}

TEST_CASE("eval dataset: --map feeds workflow inputs from row fields") {
  Row row;
  row.id = "r1";
  row.line = 4;
  row.fields = {{"question", "Why?"}, {"context", "Because."}};
  const InputMap identity = InputMap::parse({});
  CHECK(identity.apply(row, {"question"}, "d.jsonl") ==
        std::map<std::string, std::string>{{"question", "Why?"}});
  const InputMap mapped = InputMap::parse({"problem=question"});
  CHECK(mapped.apply(row, {"problem", "context"}, "d.jsonl") ==
        std::map<std::string, std::string>{{"problem", "Why?"}, {"context", "Because."}});
  try {
    identity.apply(row, {"questoin"}, "d.jsonl");
    FAIL("no error for a missing field");
  } catch (const InputError& e) {
    CHECK(e.where().line == 4);
    CHECK(e.message().find("did you mean 'question'") != std::string::npos);
  }
  CHECK_THROWS_AS(mapped.apply(row, {"context"}, "d.jsonl"), InputError);  // maps an undeclared input
  CHECK_THROWS_AS(InputMap::parse({"problem"}), InputError);
  CHECK_THROWS_AS(InputMap::parse({"=x"}), InputError);
  CHECK_THROWS_AS(InputMap::parse({"a=x", "a=y"}), InputError);
}

}  // namespace
}  // namespace choreo::eval
