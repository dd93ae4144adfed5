// The run form of `choreo eval` (runtime/eval/run.h) and its progress display (runtime/eval/progress.h).
// Properties: one result line per (row, mode), with the prediction a plain single run of that row gives and a
// score fixed by hand; shards merged equal the unsharded run; --resume runs exactly the missing pairs and
// survives a cut-off last line; every row is on disk before anyone hears it finished; bad data names its
// line; a failing row is reported and not written while the others are. The progress text is worked out by
// hand.

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "dsl/workflow_parser.h"
#include "kernels/backend.h"
#include "common/error.h"
#include "runtime/eval/merge.h"
#include "runtime/eval/progress.h"
#include "runtime/eval/run.h"
#include "runtime/exec/workflow_models.h"
#include "runtime/model/synth_lora.h"
#include "runtime/kv/page_pool.h"
#include "runtime/store/disk_store.h"
#include "tests/test_models.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

const model::Model& stories() { return *testing::stories260k().model; }

// The output ends in a fixed \boxed{42}, so a row's MATH score is known by hand: 1 when its gold is 42.
// The reply before it is sampled (temperature 0.8), so predictions differ between rows and test the plumbing.
const char* kTiny = R"yaml(
name: tiny
inputs: {problem: string}
params: {extra: 0}
sampling: {temperature: 0.8, top_k: 20, max_tokens: 6, seed: 5}
messages:
  opening: {text: "Once upon a time there was a little dog."}
  ask: {text: "{{ problem }}"}
steps:
  - decode: {as: reply, header: "Then", parents: [opening, ask], max_tokens: "6 + extra"}
output: '{{ reply }} \boxed{42}'
)yaml";

const char* kProblems[] = {"The sun was hot.", "Lily had a red ball.", "Tom went to the park.",
                           "It was night.", "A cat sat on a mat."};
const char* kGold[] = {"42", "7", "42", "42", "x"};

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() /
           ("choreo_eval_run_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
  static int& counter() {
    static int n = 0;
    return n;
  }
};

std::string write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

/// A MATH-format file with the rows above (ids r0..r4).
std::string math_data(const TempDir& dir) {
  std::string text;
  for (size_t i = 0; i < std::size(kProblems); ++i)
    text +=
        fmt::format(
            R"({{"problem": "{}", "answer": "{}", "unique_id": "r{}", "subject": "S{}", "level": "Level {}"}})",
            kProblems[i], kGold[i], i, i % 2, 1 + i % 3) +
        "\n";
  return write(dir.file("data.jsonl"), text);
}

struct Run {
  std::vector<eval::ResultRow> rows;
  eval::EvalReport report;
  std::vector<std::string> announced;  // ids in the order on_result reported them
};

Run evaluate(const dsl::Workflow& workflow, const eval::Dataset& data, const std::string& out_path,
             long limit, eval::Shard shard, const eval::EvalSettings& settings, bool resume = false) {
  const std::vector<eval::Row> selected = eval::select_rows(data.rows, limit, shard);
  const std::vector<eval::PreparedRow> rows = eval::prepare_rows(workflow, data, selected, settings);
  std::set<std::pair<std::string, std::string>> done;
  if (resume) done = eval::done_keys(eval::read_results(out_path).rows);
  Run run;
  eval::EvalCallbacks callbacks;
  callbacks.on_result = [&](const eval::ResultRow& r) {
    // The row must already be on disk when anyone hears it finished: a kill from here on loses nothing.
    const auto keys = eval::done_keys(eval::read_results(out_path).rows);
    CHECK(keys.count({r.id, r.mode}) == 1);
    run.announced.push_back(r.id + "/" + r.mode);
  };
  {
    eval::ResultWriter writer(out_path);
    run.report = eval::run_eval(workflow, stories(), rows, settings, done, writer, callbacks);
  }
  run.rows = eval::read_results(out_path).rows;
  return run;
}

eval::EvalSettings two_modes() {
  eval::EvalSettings settings;
  settings.modes = {runtime::Mode::Prefix, runtime::Mode::Choreo};
  settings.concurrency = 3;
  settings.page_tokens = 16;
  settings.cache_bytes = size_t(64) << 20;
  return settings;
}

std::map<std::pair<std::string, std::string>, eval::ResultRow> by_key(
    const std::vector<eval::ResultRow>& rows) {
  std::map<std::pair<std::string, std::string>, eval::ResultRow> out;
  for (const eval::ResultRow& r : rows)
    CHECK_MESSAGE(out.emplace(std::pair(r.id, r.mode), r).second, r.id, r.mode);
  return out;
}

TEST_CASE("eval run: a workflow's models are loaded, and each row equals a single run on an engine with them") {
  TempDir dir;
  model::SynthLoraSpec spec;
  spec.first_layer = 1;
  spec.strength = 0.2f;
  const std::string adapter = dir.file("sibling.gguf");
  model::write_synthetic_lora(stories(), spec, adapter);
  const std::string text = fmt::format(R"yaml(
name: two
inputs: {{problem: string}}
sampling: {{temperature: 0, max_tokens: 4}}
models:
  sib: {{lora: {}, reuse: {{from: default, plan: partial, layers: [2, 4]}}}}
messages:
  opening: {{text: "Once upon a time there was a little dog."}}
  ask: {{text: "{{{{ problem }}}}"}}
steps:
  - decode: {{as: first, model: sib, header: "Then", parents: [opening, ask]}}
  - decode: {{as: second, header: " And", parents: [opening, first]}}
output: '{{{{ first }}}}|{{{{ second }}}} \boxed{{42}}'
)yaml", adapter);
  const dsl::Workflow workflow = dsl::parse_workflow(text, dir.file("two.yaml"));
  const eval::Dataset data = eval::load_dataset(math_data(dir));
  const exec::WorkflowModels models = exec::load_workflow_models(workflow, stories(), {});
  eval::EvalSettings settings = two_modes();
  settings.modes = {runtime::Mode::Choreo};
  settings.models = &models.set;
  const Run run = evaluate(workflow, data, dir.file("out.jsonl"), -1, {}, settings);
  CHECK(run.report.failures.empty());
  const auto rows = by_key(run.rows);
  REQUIRE(rows.size() == std::size(kProblems));
  for (size_t i = 0; i < std::size(kProblems); ++i) {
    kv::PagePool pool(stories().backend(), stories().kv_layout(16), size_t(64) << 20);
    runtime::Engine engine(models.set, pool);
    const exec::RunResult alone = exec::run_workflow(workflow, engine, {{{"problem", kProblems[i]}}, {}});
    CHECK(rows.at({fmt::format("r{}", i), "choreo"}).prediction == alone.output);
  }
  // Without the models, every row fails at the call naming one, and nothing is written for it.
  settings.models = nullptr;
  const Run without = evaluate(workflow, data, dir.file("none.jsonl"), -1, {}, settings);
  CHECK(without.rows.empty());
  REQUIRE(without.report.failures.size() == std::size(kProblems));
  CHECK(without.report.failures.front().message.find("model `sib` is not loaded") != std::string::npos);
}

TEST_CASE(
    "eval run: one result line per (row, mode), predictions as a single run gives them, scores by hand") {
  TempDir dir;
  const dsl::Workflow workflow = dsl::parse_workflow(kTiny, "tiny.yaml");
  const eval::Dataset data = eval::load_dataset(math_data(dir));
  const Run run = evaluate(workflow, data, dir.file("out.jsonl"), -1, {}, two_modes());
  CHECK(run.report.n_run == 10);
  CHECK(run.report.n_skipped == 0);
  CHECK(run.report.failures.empty());
  CHECK(run.announced.size() == 10);
  const auto rows = by_key(run.rows);
  REQUIRE(rows.size() == 10);

  for (runtime::Mode mode : {runtime::Mode::Prefix, runtime::Mode::Choreo}) {
    // The reference: each row alone on a fresh engine of that mode, no scheduler, no batching.
    for (size_t i = 0; i < std::size(kProblems); ++i) {
      const std::string id = fmt::format("r{}", i), mode_text(runtime::mode_name(mode));
      CAPTURE(id);
      CAPTURE(mode_text);
      kv::PagePool pool(stories().backend(), stories().kv_layout(16), size_t(64) << 20);
      runtime::Engine engine(stories(), pool, mode);
      const exec::RunResult alone = exec::run_workflow(workflow, engine, {{{"problem", kProblems[i]}}, {}});
      auto it = rows.find({id, mode_text});
      REQUIRE(it != rows.end());
      const eval::ResultRow& r = it->second;
      CHECK(r.prediction == alone.output);
      CHECK(r.prediction.ends_with(" \\boxed{42}"));
      CHECK(r.extracted == "42");
      CHECK(r.score == (std::string(kGold[i]) == "42" ? 1.0 : 0.0));
      CHECK(r.gold == std::vector<std::string>{kGold[i]});
      CHECK(r.metric == "math");
      CHECK(r.subject == fmt::format("S{}", i % 2));
      CHECK(r.level == std::to_string(1 + i % 3));
      CHECK(r.extra["line"] == int(i + 1));
      // The decode generated between 1 and max_tokens tokens; it is the only decode, so TTFT <= end-to-end.
      CHECK(r.tokens_generated >= 1);
      CHECK(r.tokens_generated <= 6);
      CHECK(r.tokens_generated == alone.messages.back().n_generated);
      CHECK(r.tokens_computed > 0);
      CHECK(r.ttft_ms > 0);
      CHECK(r.ttft_ms <= r.e2e_ms);
    }
  }
  // Choreo reuses the prefilled opening and question; prefix mode's decode re-encodes them (minus a cached
  // prefix), so choreo computes fewer tokens over the run and reuses more.
  int64_t computed_prefix = 0, computed_choreo = 0, reused_prefix = 0, reused_choreo = 0;
  for (const auto& [key, r] : rows) {
    (key.second == "prefix" ? computed_prefix : computed_choreo) += r.tokens_computed;
    (key.second == "prefix" ? reused_prefix : reused_choreo) += r.tokens_reused;
  }
  CHECK(computed_choreo < computed_prefix);
  CHECK(reused_choreo > reused_prefix);
}

TEST_CASE("eval run: choreo mode reads encodings from a store: same generations, the stored tokens not computed") {
  TempDir dir;
  const dsl::Workflow workflow = dsl::parse_workflow(kTiny, "tiny.yaml");
  const eval::Dataset data = eval::load_dataset(math_data(dir));
  // Row r0 run once on an engine that saves every prefill: the shared opening and r0's question are stored.
  const std::filesystem::path store_dir = dir.path / "store";
  int stored_tokens = 0;
  {
    store::DiskStore writer_store(store_dir.string(), /*create=*/true);
    kv::PagePool pool(stories().backend(), stories().kv_layout(16), size_t(64) << 20);
    runtime::Engine engine(stories(), pool, runtime::Mode::Choreo);
    engine.set_disk_store(&writer_store, /*persist_prefills=*/true);
    const exec::RunResult saved = exec::run_workflow(workflow, engine, {{{"problem", kProblems[0]}}, {}});
    for (const exec::MessageRecord& m : saved.messages)
      if (m.name == "opening" || m.name == "ask") stored_tokens += m.n_computed;
  }
  REQUIRE(stored_tokens > 0);

  const Run plain = evaluate(workflow, data, dir.file("plain.jsonl"), -1, {}, two_modes());
  eval::EvalSettings with_store = two_modes();
  with_store.stores.disk_dir = store_dir.string();  // read only
  const Run stored = evaluate(workflow, data, dir.file("stored.jsonl"), -1, {}, with_store);
  const auto a = by_key(plain.rows), b = by_key(stored.rows);
  REQUIRE(a.size() == 10);
  REQUIRE(b.size() == 10);
  int64_t computed[2][2] = {};  // [mode: prefix, choreo][plain, stored]
  for (const auto& [key, r] : a) {
    CAPTURE(key.first);
    CAPTURE(key.second);
    const eval::ResultRow& s = b.at(key);
    CHECK(s.prediction == r.prediction);
    CHECK(s.extra["decodes_xxh3"] == r.extra["decodes_xxh3"]);
    const int m = key.second == "choreo";
    computed[m][0] += r.tokens_computed;
    computed[m][1] += s.tokens_computed;
  }
  // The five rows run as one group on one engine (concurrency 3 → groups of 6): the opening is loaded once
  // instead of computed once, and r0's question is loaded. The baseline never reads the store.
  CHECK(computed[1][0] - computed[1][1] == stored_tokens);
  CHECK(computed[0][0] == computed[0][1]);
}

TEST_CASE("eval run: a row's computed + reused tokens do not depend on which row encoded a shared message") {
  // One engine per mode serves the whole run, at any concurrency: one row computes the static opening and
  // the others reuse it, whichever row that is. Per row, the sum must not change.
  TempDir dir;
  const dsl::Workflow workflow = dsl::parse_workflow(kTiny, "tiny.yaml");
  const eval::Dataset data = eval::load_dataset(math_data(dir));
  eval::EvalSettings settings = two_modes();
  settings.modes = {runtime::Mode::Choreo};
  const auto three = by_key(evaluate(workflow, data, dir.file("c3.jsonl"), -1, {}, settings).rows);
  settings.concurrency = 1;
  const auto one = by_key(evaluate(workflow, data, dir.file("c1.jsonl"), -1, {}, settings).rows);
  REQUIRE(three.size() == 5);
  REQUIRE(one.size() == 5);
  int64_t computed_three = 0, computed_one = 0;
  for (const auto& [key, r] : three) {
    CAPTURE(key.first);
    const eval::ResultRow& o = one.at(key);
    CHECK(r.extra["decodes_xxh3"] == o.extra["decodes_xxh3"]);
    CHECK(r.tokens_computed + r.tokens_reused == o.tokens_computed + o.tokens_reused);
    computed_three += r.tokens_computed;
    computed_one += o.tokens_computed;
  }
  CHECK(computed_three == computed_one);  // the opening is computed once per run, whatever the concurrency
}

TEST_CASE(
    "eval run: a MATH output without a box is the answer the workflow extracted, an empty one scores 0") {
  // madpar's output is `boxed(...)`: the answer itself. Official rule for text with a box; none here.
  TempDir dir;
  const dsl::Workflow workflow = dsl::parse_workflow(
      "name: answer\ninputs: {problem: string}\nsampling: {max_tokens: 2}\nmessages:\n  ask: {text: \"{{ "
      "problem }}\"}\n"
      "steps:\n  - decode: {as: reply, header: \"Then\", parents: [ask]}\n"
      "output: \"{{ '' if problem == 'none' else '0.5' }}\"\n",
      "answer.yaml");
  const std::string path =
      write(dir.file("d.jsonl"),
            "{\"problem\": \"a\", \"answer\": \"\\\\frac{1}{2}\", \"unique_id\": \"half\"}\n"
            "{\"problem\": \"b\", \"answer\": \"\\\\frac14\", \"unique_id\": \"quarter\"}\n"
            "{\"problem\": \"none\", \"answer\": \"\", \"unique_id\": \"empty\"}\n");
  eval::EvalSettings settings = two_modes();
  settings.modes = {runtime::Mode::Choreo};
  const auto rows =
      by_key(evaluate(workflow, eval::load_dataset(path), dir.file("out.jsonl"), -1, {}, settings).rows);
  REQUIRE(rows.size() == 3);
  // 0.5 equals \frac{1}{2} (the one special case of the official rules), not \frac{1}{4}.
  CHECK(rows.at({"half", "choreo"}).prediction == "0.5");
  CHECK(rows.at({"half", "choreo"}).extracted == "0.5");
  CHECK(rows.at({"half", "choreo"}).score == 1.0);
  CHECK(rows.at({"quarter", "choreo"}).score == 0.0);
  // Nothing answered: nothing extracted, even against an empty gold answer.
  CHECK(rows.at({"empty", "choreo"}).extracted == "");
  CHECK(rows.at({"empty", "choreo"}).score == 0.0);
}

TEST_CASE("eval run: shards 0/2 and 1/2 merged give the unsharded run's per-row results") {
  TempDir dir;
  const dsl::Workflow workflow = dsl::parse_workflow(kTiny, "tiny.yaml");
  const eval::Dataset data = eval::load_dataset(math_data(dir));
  const Run whole = evaluate(workflow, data, dir.file("all.jsonl"), 4, {}, two_modes());
  const Run first = evaluate(workflow, data, dir.file("s0.jsonl"), 4, {0, 2}, two_modes());
  const Run second = evaluate(workflow, data, dir.file("s1.jsonl"), 4, {1, 2}, two_modes());
  CHECK(first.rows.size() == 4);
  CHECK(second.rows.size() == 4);
  for (const eval::ResultRow& r : first.rows) CHECK((r.id == "r0" || r.id == "r2"));
  for (const eval::ResultRow& r : second.rows) CHECK((r.id == "r1" || r.id == "r3"));

  const eval::Merged merged = eval::merge_results({dir.file("s1.jsonl"), dir.file("s0.jsonl")});
  CHECK(merged.n_duplicates == 0);
  const auto expected = by_key(whole.rows);
  const auto got = by_key(merged.rows);
  REQUIRE(expected.size() == 8);
  REQUIRE(got.size() == expected.size());
  for (const auto& [key, row] : expected) {
    CAPTURE(key.first);
    CAPTURE(key.second);
    auto it = got.find(key);
    REQUIRE(it != got.end());
    CHECK(it->second.prediction == row.prediction);
    CHECK(it->second.score == row.score);
    CHECK(it->second.same_outcome(row));
    // The same generations, every decode of the row (not only the output).
    REQUIRE(row.extra.contains("decodes_xxh3"));
    CHECK(row.extra["decodes_xxh3"].get<std::string>().size() == 16);
    CHECK(it->second.extra["decodes_xxh3"] == row.extra["decodes_xxh3"]);
  }
  // Different rows generate different text, so within a mode their fingerprints differ.
  std::set<std::pair<std::string, std::string>> fingerprints;  // (mode, fingerprint)
  for (const auto& [key, row] : expected) fingerprints.insert({row.mode, row.extra["decodes_xxh3"].get<std::string>()});
  CHECK(fingerprints.size() == expected.size());
}

TEST_CASE("eval run: --resume runs only the missing (row, mode) pairs, after a cut-off last line too") {
  TempDir dir;
  const dsl::Workflow workflow = dsl::parse_workflow(kTiny, "tiny.yaml");
  const eval::Dataset data = eval::load_dataset(math_data(dir));
  const std::string out = dir.file("out.jsonl");
  const Run partial = evaluate(workflow, data, out, 2, {}, two_modes());
  REQUIRE(partial.rows.size() == 4);
  {
    std::ofstream append(out, std::ios::app | std::ios::binary);
    append << R"({"id": "r2", "mode": "prefix", "prediction": "cut off by a ki)";  // a killed writer's line
  }
  CHECK(eval::read_results(out).truncated_tail);

  const Run resumed = evaluate(workflow, data, out, 4, {}, two_modes(), /*resume=*/true);
  CHECK(resumed.report.n_skipped == 4);
  CHECK(resumed.report.n_run == 4);
  std::vector<std::string> announced = resumed.announced;
  std::sort(announced.begin(), announced.end());
  CHECK(announced == std::vector<std::string>{"r2/choreo", "r2/prefix", "r3/choreo", "r3/prefix"});
  const eval::ResultsFile file = eval::read_results(out);
  CHECK_FALSE(file.truncated_tail);
  const auto rows = by_key(file.rows);
  CHECK(rows.size() == 8);

  // Resumed or not, a row's outcome is the one an uninterrupted run gives.
  TempDir other;
  const Run straight = evaluate(workflow, data, other.file("out.jsonl"), 4, {}, two_modes());
  for (const eval::ResultRow& r : straight.rows) CHECK(rows.at({r.id, r.mode}).same_outcome(r));

  // Nothing left: a second resume runs nothing.
  const Run again = evaluate(workflow, data, out, 4, {}, two_modes(), true);
  CHECK(again.report.n_run == 0);
  CHECK(again.report.n_skipped == 8);
  CHECK(again.rows.size() == 8);
}

TEST_CASE("eval run: rows carry the models' fingerprint, and --resume refuses a file made with other models") {
  TempDir dir;
  const dsl::Workflow workflow = dsl::parse_workflow(kTiny, "tiny.yaml");
  const eval::Dataset data = eval::load_dataset(math_data(dir));
  const std::string out = dir.file("out.jsonl");
  const eval::EvalSettings settings = two_modes();
  const Run run = evaluate(workflow, data, out, 2, {}, settings);
  REQUIRE(run.rows.size() == 4);
  const std::string mine = eval::models_fingerprint(stories(), settings);
  CHECK(mine.size() == 16);
  for (const eval::ResultRow& r : run.rows) CHECK(r.extra.value("models_xxh3", "") == mine);
  CHECK_NOTHROW(eval::check_resumed_models(run.rows, mine, out));

  // Other KV cache types, or the workflow's models under other names: another setup, refused with the
  // file, the row and both fingerprints named.
  eval::EvalSettings q8 = settings;
  q8.k_type = kernels::DType::Q8_0;
  runtime::ModelSet renamed(stories(), {}, "other");
  eval::EvalSettings with_set = settings;
  with_set.models = &renamed;
  runtime::ModelSet same(stories());
  eval::EvalSettings with_same = settings;
  with_same.models = &same;
  CHECK(eval::models_fingerprint(stories(), with_same) == mine);  // the default set of one model is the model
  for (const eval::EvalSettings* other : {&q8, &with_set}) {
    const std::string theirs = eval::models_fingerprint(stories(), *other);
    CHECK(theirs != mine);
    try {
      eval::check_resumed_models(run.rows, theirs, out);
      FAIL("no InputError");
    } catch (const InputError& e) {
      CHECK(std::string(e.what()).find("was made with other models") != std::string::npos);
      CHECK(std::string(e.what()).find(mine) != std::string::npos);
      CHECK(std::string(e.what()).find(theirs) != std::string::npos);
      CHECK(std::string(e.hint()).find("--out") != std::string::npos);
    }
  }
  // Files of older versions have no fingerprint: nothing to check.
  std::vector<eval::ResultRow> old = run.rows;
  for (eval::ResultRow& r : old) r.extra.erase("models_xxh3");
  CHECK_NOTHROW(eval::check_resumed_models(old, eval::models_fingerprint(stories(), q8), out));
}

TEST_CASE("eval run: a row that fails is reported with its line and not written, the others are") {
  TempDir dir;
  const dsl::Workflow workflow = dsl::parse_workflow(kTiny, "tiny.yaml");
  // stories260K has a 512-token context: a 3000-word problem overflows it at run time.
  std::string huge;
  for (int i = 0; i < 3000; ++i) huge += "dog ";
  const std::string path =
      write(dir.file("data.jsonl"),
            "{\"problem\": \"The sun was hot.\", \"answer\": \"42\", \"unique_id\": \"a\"}\n"
            "{\"problem\": \"" +
                huge +
                "\", \"answer\": \"42\", \"unique_id\": \"b\"}\n"
                "{\"problem\": \"It was night.\", \"answer\": \"42\", \"unique_id\": \"c\"}\n");
  const eval::Dataset data = eval::load_dataset(path);
  eval::EvalSettings settings = two_modes();
  settings.modes = {runtime::Mode::Choreo};
  const Run run = evaluate(workflow, data, dir.file("out.jsonl"), -1, {}, settings);
  REQUIRE(run.report.failures.size() == 1);
  CHECK(run.report.failures[0].id == "b");
  CHECK(run.report.failures[0].line == 2);
  CHECK(run.report.failures[0].mode == "choreo");
  CHECK_FALSE(run.report.failures[0].message.empty());
  const auto rows = by_key(run.rows);
  CHECK(rows.size() == 2);
  CHECK(rows.count({"a", "choreo"}) == 1);
  CHECK(rows.count({"c", "choreo"}) == 1);
}

/// The InputError prepare_rows throws, or a failed check when it throws none.
InputError prepare_error(const dsl::Workflow& workflow, const std::string& path,
                         const eval::EvalSettings& settings,
                         std::optional<eval::DataFormat> format = std::nullopt) {
  try {
    const eval::Dataset data = eval::load_dataset(path, format);
    eval::prepare_rows(workflow, data, data.rows, settings);
  } catch (const InputError& e) {
    return e;
  }
  FAIL("no InputError");
  return InputError("");
}

TEST_CASE("eval run: bad data is an InputError at the data file's line, before any model time") {
  TempDir dir;
  const dsl::Workflow workflow = dsl::parse_workflow(kTiny, "tiny.yaml");
  eval::EvalSettings settings;
  settings.metric = eval::Metric::qa_f1;

  SUBCASE("a row without the field an input needs") {
    const std::string path = write(dir.file("d.jsonl"),
                                   "{\"problem\": \"a\", \"answer\": \"x\"}\n\n"
                                   "{\"question\": \"b\", \"answer\": \"y\"}\n");
    const InputError e = prepare_error(workflow, path, settings, eval::DataFormat::jsonl);
    CHECK(e.where().file == path);
    CHECK(e.where().line == 3);
    CHECK(e.message().find("problem") != std::string::npos);
  }
  SUBCASE("--map names a field the rows have") {
    const std::string path = write(dir.file("d.jsonl"), "{\"question\": \"b\", \"answer\": \"y\"}\n");
    settings.input_map = eval::InputMap::parse({"problem=question"});
    const eval::Dataset data = eval::load_dataset(path, eval::DataFormat::jsonl);
    const auto rows = eval::prepare_rows(workflow, data, data.rows, settings);
    REQUIRE(rows.size() == 1);
    CHECK(rows[0].arguments.inputs.at("problem") == "b");
    CHECK(rows[0].metric == eval::Metric::qa_f1);
  }
  SUBCASE("a malformed line") {
    const std::string path =
        write(dir.file("d.jsonl"), "{\"problem\": \"a\", \"answer\": \"x\"}\n{\"problem\": \n");
    CHECK(prepare_error(workflow, path, settings).where().line == 2);
  }
  SUBCASE("gold the metric cannot use") {
    settings.metric = eval::Metric::retrieval;
    const std::string path = write(dir.file("d.jsonl"),
                                   "{\"problem\": \"a\", \"answer\": \"Paragraph 3\"}\n"
                                   "{\"problem\": \"b\", \"answer\": \"no paragraph\"}\n");
    const InputError e = prepare_error(workflow, path, settings, eval::DataFormat::jsonl);
    CHECK(e.where().line == 2);
    CHECK(e.message().find("row '1'") != std::string::npos);
  }
  SUBCASE("plain jsonl without --metric") {
    settings.metric.reset();
    const std::string path = write(dir.file("d.jsonl"), "{\"problem\": \"a\", \"answer\": \"x\"}\n");
    const InputError e = prepare_error(workflow, path, settings, eval::DataFormat::jsonl);
    CHECK(e.hint().find("--metric") != std::string::npos);
  }
  SUBCASE("a --param the workflow lacks, or of the wrong type") {
    const std::string path = write(dir.file("d.jsonl"), "{\"problem\": \"a\", \"answer\": \"x\"}\n");
    settings.shared.params = {{"rounds", "2"}};
    CHECK(prepare_error(workflow, path, settings).message().find("rounds") != std::string::npos);
    settings.shared.params = {{"extra", "two"}};
    CHECK(prepare_error(workflow, path, settings).message().find("extra") != std::string::npos);
  }
  SUBCASE("a workflow without output") {
    const dsl::Workflow silent = dsl::parse_workflow(
        "name: silent\ninputs: {problem: string}\nmessages:\n  ask: {text: \"{{ problem }}\"}\n"
        "steps:\n  - decode: {as: reply, header: \"Then\", parents: [ask]}\n",
        "silent.yaml");
    const std::string path = write(dir.file("d.jsonl"), "{\"problem\": \"a\", \"answer\": \"x\"}\n");
    const InputError e = prepare_error(silent, path, settings);
    CHECK(e.message().find("output") != std::string::npos);
    CHECK(e.where().file == "silent.yaml");
  }
}

TEST_CASE("eval progress: the text for given counts and times, worked by hand") {
  CHECK(eval::format_duration(0) == "0:00");
  CHECK(eval::format_duration(59.6) == "1:00");
  CHECK(eval::format_duration(3725) == "1:02:05");
  CHECK(eval::format_duration(-1) == "--:--");

  eval::ProgressState s;
  s.done = 10;
  s.total = 40;
  s.failed = 0;
  s.score_sum = 4;  // 4 right of 10: mean 40.0
  s.mode = "prefix";
  s.elapsed_s = 20;  // 0.5 runs/s; 30 left -> 60 s
  CHECK(eval::rate_per_s(s) == doctest::Approx(0.5));
  CHECK(eval::eta_s(s) == doctest::Approx(60));
  CHECK(eval::render_bar(s) == "[######------------------]  10/40  25%  0.50/s  ETA 1:00  mean 40.0  prefix");
  CHECK(eval::render_line(s) == "eval: 10/40 (25%), 0.50/s, ETA 1:00, mean score 40.0, mode prefix");

  s.failed = 2;  // the mean is over the 8 that succeeded: 4/8
  CHECK(eval::render_line(s) ==
        "eval: 10/40 (25%), 0.50/s, ETA 1:00, mean score 50.0, mode prefix, 2 failed");
  s.done = 1;
  s.failed = 0;
  s.score_sum = 0;
  s.elapsed_s = 40;  // one run in 40 s: slower than 0.1/s is shown as seconds per run
  CHECK(eval::render_line(s) == "eval: 1/40 (2%), 40.0s each, ETA 26:00, mean score 0.0, mode prefix");
  const eval::ProgressState none{0, 3, 0, 0, "", 5};
  CHECK(eval::render_bar(none, 6) == "[------]  0/3  0%  --/s  ETA --:--  mean --");

  SUBCASE("plain lines: at most one per interval, and always the last") {
    eval::Progress progress(4, /*terminal=*/false, /*interval_s=*/10);
    CHECK(progress.start_mode("choreo", 100) ==
          "eval: 0/4 (0%), --/s, ETA --:--, mean score --, mode choreo\n");
    CHECK(progress.finished(true, 1, 102).empty());  // 2 s after the last line
    CHECK(progress.finished(true, 0, 111) ==
          "eval: 2/4 (50%), 0.18/s, ETA 0:11, mean score 50.0, mode choreo\n");  // 2 in 11 s
    CHECK(progress.finished(false, 0, 112).empty());
    CHECK(progress.finished(true, 1, 113) ==
          "eval: 4/4 (100%), 0.31/s, ETA 0:00, mean score 66.7, mode choreo, 1 failed\n");
    CHECK(progress.close().empty());
  }
  SUBCASE("terminal: every change redraws the bar in place, and close ends its line") {
    eval::Progress progress(2, /*terminal=*/true);
    const std::string first = progress.start_mode("naive", 0);
    CHECK(first.starts_with("\r["));
    CHECK(first.ends_with("\033[K"));
    CHECK(progress.finished(true, 1, 1) ==
          "\r[############------------]  1/2  50%  1.00/s  ETA 0:01  mean 100.0  naive\033[K");
    CHECK(progress.close() == "\n");
    CHECK(progress.close().empty());
  }
}

}  // namespace
}  // namespace choreo
