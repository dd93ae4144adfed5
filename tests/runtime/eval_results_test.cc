// Results files, merge and summaries (runtime/eval/results.h, merge.h, summary.h, score_file.h): a killed
// writer loses nothing already written, shards merge back into the unsharded run, conflicting duplicates
// are refused, and the summary's numbers are the hand-computed ones.

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "runtime/eval/merge.h"
#include "runtime/eval/results.h"
#include "runtime/eval/score_file.h"
#include "runtime/eval/selection.h"
#include "runtime/eval/summary.h"
#include "tests/scratch_dir.h"

namespace choreo::eval {
namespace {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() / ("choreo_eval_results_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

ResultRow make_row(const std::string& id, const std::string& mode, double score, double ttft_ms = 10) {
  ResultRow row;
  row.id = id;
  row.mode = mode;
  row.prediction = "the answer is \\boxed{" + id + "}";
  row.extracted = id;
  row.gold = {id};
  row.score = score;
  row.metric = "math";
  row.ttft_ms = ttft_ms;
  row.e2e_ms = 4 * ttft_ms;
  row.tokens_generated = 7;
  return row;
}

void append_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::app) << text;
}

TEST_CASE("eval results: rows round-trip through the file") {
  TempDir dir;
  ResultRow row = make_row("r1", "choreo", 1);
  row.subject = "Algebra";
  row.level = "3";
  row.tokens_computed = 120;
  row.tokens_reused = 80;
  row.extra["note"] = "x";
  {
    ResultWriter writer(dir.file("out.jsonl"));
    writer.append(row);
  }
  const ResultsFile file = read_results(dir.file("out.jsonl"));
  REQUIRE(file.rows.size() == 1);
  const ResultRow& back = file.rows[0];
  CHECK(back.same_outcome(row));
  CHECK(back.subject == "Algebra");
  CHECK(back.level == "3");
  CHECK(back.ttft_ms == 10);
  CHECK(back.e2e_ms == 40);
  CHECK(back.tokens_generated == 7);
  CHECK(back.tokens_computed == 120);
  CHECK(back.tokens_reused == 80);
  CHECK(back.extra["note"] == "x");
  CHECK(read_results(dir.file("absent.jsonl")).rows.empty());
}

TEST_CASE("eval results: a kill mid-line loses only that line, and resuming continues cleanly") {
  TempDir dir;
  const std::string path = dir.file("out.jsonl");
  {
    ResultWriter writer(path);
    writer.append(make_row("a", "prefix", 1));
    writer.append(make_row("b", "prefix", 0));
  }
  append_text(path, "{\"id\": \"c\", \"mode\": \"pre");  // what a killed writer leaves
  ResultsFile file = read_results(path);
  CHECK(file.truncated_tail);
  REQUIRE(file.rows.size() == 2);
  const auto done = done_keys(file.rows);
  CHECK(done.count({"a", "prefix"}) == 1);
  CHECK(done.count({"c", "prefix"}) == 0);
  {
    ResultWriter writer(path);  // cuts the partial line before appending
    writer.append(make_row("c", "prefix", 1));
  }
  file = read_results(path);
  CHECK_FALSE(file.truncated_tail);
  REQUIRE(file.rows.size() == 3);
  CHECK(file.rows[2].id == "c");
  CHECK(file.lines[2] == 3);
}

TEST_CASE(
    "eval results: a whole last row without its newline is kept and ended, other unended text refused") {
  TempDir dir;
  const std::string path = dir.file("out.jsonl");
  const std::string whole = result_line(make_row("a", "prefix", 1));
  append_text(path, whole.substr(0, whole.size() - 1));  // the row, short of its newline
  REQUIRE(read_results(path).rows.size() == 1);          // read as done, so it must stay
  {
    ResultWriter writer(path);
    writer.append(make_row("b", "prefix", 0));
  }
  const ResultsFile file = read_results(path);
  REQUIRE(file.rows.size() == 2);
  CHECK(file.rows[0].same_outcome(make_row("a", "prefix", 1)));
  CHECK(testing::read_file(path) == whole + result_line(make_row("b", "prefix", 0)));

  // Text that is not a row's start, and a start shorter than a row's first key, are not a killed writer's:
  // reading and appending both refuse, the file unchanged.
  for (const std::string text : {"token", "{\"i", "{\"note\": 1", "{\"note\": 1}"}) {
    CAPTURE(text);
    const std::string other = dir.file("other.txt");
    std::filesystem::remove(other);
    append_text(other, text);
    CHECK_THROWS_AS(ResultWriter{other}, InputError);
    CHECK(testing::read_file(other) == text);
  }
  const std::string note = dir.file("note.txt");
  append_text(note, "token");
  CHECK_THROWS_AS(read_results(note), InputError);
}

TEST_CASE("eval results: a malformed line that is not the cut-off tail is an error at its line") {
  TempDir dir;
  const std::string path = dir.file("bad.jsonl");
  {
    ResultWriter writer(path);
    writer.append(make_row("a", "prefix", 1));
  }
  append_text(path, "not json\n");
  {
    ResultWriter writer(path);
    writer.append(make_row("b", "prefix", 1));
  }
  try {
    read_results(path);
    FAIL("no error");
  } catch (const InputError& e) {
    CHECK(e.where().line == 2);
  }
  append_text(dir.file("missing.jsonl"), "{\"mode\": \"x\", \"score\": 1}\n");
  CHECK_THROWS_AS(read_results(dir.file("missing.jsonl")), InputError);
}

TEST_CASE("eval results: merging shards gives the unsharded summary, duplicates must agree") {
  TempDir dir;
  std::vector<ResultRow> all;
  for (int i = 0; i < 9; ++i) {
    all.push_back(make_row(std::to_string(i), "prefix", i % 3 == 0 ? 1 : 0, 20));
    all.push_back(make_row(std::to_string(i), "choreo", i % 2 == 0 ? 1 : 0, 5));
  }
  // Shard by row index, as `--shard I/2` does, and write each shard's rows in reverse order.
  for (int shard = 0; shard < 2; ++shard) {
    ResultWriter writer(dir.file("shard" + std::to_string(shard) + ".jsonl"));
    for (auto it = all.rbegin(); it != all.rend(); ++it)
      if (in_shard(static_cast<size_t>(std::stoi(it->id)), Shard{shard, 2})) writer.append(*it);
  }
  const Merged merged =
      merge_results({dir.file("shard0.jsonl"), dir.file("shard1.jsonl"), dir.file("shard0.jsonl")});
  CHECK(merged.rows.size() == all.size());
  CHECK(merged.n_duplicates == 10);  // shard 0 holds rows 0, 2, 4, 6, 8 in both modes
  CHECK(summary_to_json(summarize(merged.rows)) == summary_to_json(summarize(all)));

  write_results(dir.file("merged.jsonl"), merged.rows);
  CHECK(read_results(dir.file("merged.jsonl")).rows.size() == all.size());

  ResultRow changed = all[0];
  changed.score = 1 - changed.score;
  {
    ResultWriter writer(dir.file("conflict.jsonl"));
    writer.append(changed);
  }
  try {
    merge_results({dir.file("shard0.jsonl"), dir.file("conflict.jsonl")});
    FAIL("no error for a conflicting duplicate");
  } catch (const InputError& e) {
    CHECK(e.where().file == dir.file("conflict.jsonl"));
    CHECK(e.message().find("shard0.jsonl") != std::string::npos);
  }
}

TEST_CASE("eval results: the summary's numbers, by hand") {
  // prefix: 1 0 1 0 (ttft 100); choreo: 1 1 1 0 (ttft 50) -> difference +0.25, b = 0, c = 1.
  std::vector<ResultRow> rows;
  const double prefix[] = {1, 0, 1, 0}, choreo[] = {1, 1, 1, 0};
  for (int i = 0; i < 4; ++i) {
    rows.push_back(make_row(std::to_string(i), "choreo", choreo[i], 50));
    rows.push_back(make_row(std::to_string(i), "prefix", prefix[i], 100));
  }
  rows[0].subject = "Algebra";
  const Summary s = summarize(rows);
  REQUIRE(s.modes.size() == 2);
  CHECK(s.metric == "math");
  CHECK(s.modes[0].mode == "prefix");  // the baseline comes first wherever its rows appear
  CHECK(s.modes[0].score.mean == 0.5);
  CHECK(s.modes[1].mode == "choreo");
  CHECK(s.modes[1].score.mean == 0.75);
  CHECK(s.modes[1].tokens_generated == 28);
  CHECK(s.modes[1].by_subject.at("Algebra").n == 1);
  REQUIRE(s.comparisons.size() == 1);
  const Comparison& c = s.comparisons[0];
  CHECK(c.baseline == "prefix");
  CHECK(c.treatment == "choreo");
  CHECK(c.n_pairs == 4);
  CHECK(c.difference.mean == doctest::Approx(0.25));
  REQUIRE(c.mcnemar.has_value());
  CHECK(c.mcnemar->b == 0);
  CHECK(c.mcnemar->c == 1);
  CHECK(c.mcnemar->p_value == 1.0);
  CHECK(*c.ttft_ratio == doctest::Approx(2.0));
  CHECK(*c.e2e_ratio == doctest::Approx(2.0));
  CHECK(format_summary(s).find("choreo vs prefix (4 paired rows)") != std::string::npos);

  rows[0].score = 0.5;  // not 0/1 any more: no McNemar
  CHECK_FALSE(summarize(rows).comparisons[0].mcnemar.has_value());
}

TEST_CASE("eval results: scoring a LongBench-style predictions file") {
  TempDir dir;
  const std::string path = dir.file("pred.jsonl");
  append_text(path,
              "{\"pred\": \"The cat sat on the mat\", \"answers\": [\"a cat on a mat\", \"dog\"]}\n"
              "{\"prediction\": \"Paris\", \"gold\": \"Paris\", \"id\": \"q2\", \"tokens_generated\": 3, "
              "\"tokens_computed\": 40, \"tokens_reused\": 7}\n");
  const std::vector<ResultRow> rows = score_file(path, Metric::qa_f1);
  REQUIRE(rows.size() == 2);
  CHECK(rows[1].tokens_generated == 3);  // token counts are read when present (summed in the summary)
  CHECK(summarize(rows).modes[0].tokens_computed == 40);
  CHECK(summarize(rows).modes[0].tokens_reused == 7);
  CHECK(rows[0].id == "1");
  CHECK(rows[0].score == doctest::Approx(6.0 / 7.0));
  CHECK(rows[1].id == "q2");
  CHECK(rows[1].score == 1.0);
  CHECK(summarize(rows).modes[0].score.mean == doctest::Approx((6.0 / 7.0 + 1) / 2));

  append_text(dir.file("nogold.jsonl"), "{\"pred\": \"x\"}\n");
  try {
    score_file(dir.file("nogold.jsonl"), Metric::qa_f1);
    FAIL("no error");
  } catch (const InputError& e) {
    CHECK(e.where().line == 1);
  }
  append_text(dir.file("retrieval.jsonl"),
              "{\"pred\": \"1\", \"answers\": [\"Paragraph 1\"]}\n"
              "{\"pred\": \"1\", \"answers\": [\"one\"]}\n");
  try {
    score_file(dir.file("retrieval.jsonl"), Metric::retrieval);
    FAIL("no error");
  } catch (const InputError& e) {
    CHECK(e.where().line == 2);
  }
  append_text(dir.file("empty.jsonl"), "");
  CHECK_THROWS_AS(score_file(dir.file("empty.jsonl"), Metric::qa_f1), InputError);
}

}  // namespace
}  // namespace choreo::eval
