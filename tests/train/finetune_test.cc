// `choreo finetune` end to end on stories260K (issue 13):
// - `traces` at temperature 0 records what a prefix-mode `choreo run` generates, and resumes;
// - `train` learns a fixed continuation: the held-out loss falls below a stated bound within a stated number
//   of steps, and `choreo run --lora` with the adapter then generates the continuation for an input it never
//   saw;
// - the adapter loads in llama.cpp, which gives the same greedy continuation as choreo with it;
// - bad input (rank 0, an empty traces file, a trace of another workflow, more tokens than a call's
//   max_tokens, a malformed line) is exit 2 before any training step, and writes nothing.

#include "runtime/train/finetune.h"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "dsl/workflow_parser.h"
#include "runtime/exec/interpreter.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/gguf.h"
#include "runtime/model/sampler.h"
#include "runtime/model/session.h"
#include "runtime/train/graph.h"
#include "tests/cli_process.h"
#include "tests/reference/reference.h"
#include "tests/scratch_dir.h"
#include "tests/test_models.h"
#include "tests/test_paths.h"
#include "tests/train/toy_traces.h"
#include "tests/train/train_workflows.h"

namespace choreo {
namespace {

constexpr const char* kWorkflow = testing::kToyWorkflow;
constexpr const char* kContinuation = testing::kToyContinuation;
const auto& kNames = testing::kToyNames;

/// What `choreo run` printed as the workflow's output.
std::string output_of(const std::string& out) {
  const std::string mark = "── output\n";
  const size_t at = out.find(mark);
  return at == std::string::npos ? out : out.substr(at + mark.size());
}

struct Toy {
  testing::ScratchDir dir;
  std::string workflow = (dir.path / "toy.yaml").string();
  std::string rows = (dir.path / "rows.jsonl").string();
  std::string model = testing::shared_file("models/stories260K.gguf");
  Toy() {
    std::ofstream(workflow) << kWorkflow;
    std::ofstream out(rows);
    for (const char* n : kNames) out << nlohmann::json{{"name", n}}.dump() << "\n";
  }
  testing::ProcessResult choreo(std::vector<std::string> args) const {
    return testing::run_process(testing::choreo_binary(), args, dir.path, {.timeout_seconds = 600});
  }
  /// Traces in which every row's decode generated the continuation.
  std::string fixed_traces(const std::string& name, const std::function<void(nlohmann::json&)>& edit = {}) const {
    const std::string path = (dir.path / name).string();
    testing::write_fixed_traces(path, edit);
    return path;
  }
};

TEST_CASE("finetune traces: at temperature 0 a trace is what a prefix-mode run generates, and a second run resumes") {
  const Toy toy;
  const std::string traces = (toy.dir.path / "traces.jsonl").string();
  const auto sample = [&] {
    return toy.choreo({"finetune", "traces", toy.workflow, "--inputs", toy.rows, "--limit", "3", "--temperature", "0",
                       "-o", traces, "-m", toy.model});
  };
  const testing::ProcessResult first = sample();
  INFO(first.err);
  REQUIRE(first.exit_code == 0);
  std::vector<nlohmann::json> lines;
  {
    std::ifstream in(traces);
    for (std::string l; std::getline(in, l);) lines.push_back(nlohmann::json::parse(l));
  }
  REQUIRE(lines.size() == 3);
  const model::Model& m = *testing::stories260k().model;
  for (size_t i = 0; i < 3; ++i) {
    CHECK(lines[i]["line"] == int(i + 1));
    REQUIRE(lines[i]["calls"].size() == 1);
    CHECK(lines[i]["calls"][0]["name"] == "next");
    const std::vector<int32_t> generated = lines[i]["calls"][0]["generated"];
    const testing::ProcessResult run = toy.choreo({"run", toy.workflow, "--input", std::string("name=") + kNames[i],
                                                   "--mode", "prefix", "-m", toy.model});
    REQUIRE(run.exit_code == 0);
    std::vector<int32_t> visible = generated;
    if (!visible.empty() && m.vocab().is_eog(visible.back())) visible.pop_back();
    CHECK(output_of(run.out) == m.vocab().detokenize(visible) + "\n");
  }
  const testing::ProcessResult again = sample();
  REQUIRE(again.exit_code == 0);
  CHECK(again.out.find("0 rows sampled, 3 already") != std::string::npos);
}

TEST_CASE("finetune traces: a row that fails is reported with its line, the others are sampled, and exit is 2") {
  const Toy toy;
  const std::string workflow = (toy.dir.path / "pick.yaml").string(), rows = (toy.dir.path / "pick.jsonl").string();
  std::ofstream(workflow) << R"Y(name: pick
inputs:
  names: list
messages:
  story: {text: "{{ names[1] }} went to the park."}
steps:
  - decode: {as: next, parents: [story], header: " Then", max_tokens: 3, temperature: 0}
output: "{{ next }}"
)Y";
  std::ofstream(rows) << R"({"names": ["Tom", "Lily"]})" "\n" R"({"names": ["Ben"]})" "\n" R"({"names": ["Sue", "Max"]})" "\n";
  const std::string traces = (toy.dir.path / "traces.jsonl").string();
  const testing::ProcessResult r = toy.choreo({"finetune", "traces", workflow, "--inputs", rows, "--temperature", "0",
                                               "-o", traces, "-m", toy.model});
  INFO(r.err);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find(rows + ":2: this row failed") != std::string::npos);
  CHECK(r.err.find("1 of 3 rows failed") != std::string::npos);
  std::vector<int> lines;
  {
    std::ifstream in(traces);
    for (std::string l; std::getline(in, l);) lines.push_back(nlohmann::json::parse(l)["line"].get<int>());
  }
  CHECK(lines == std::vector<int>{1, 3});
}

TEST_CASE("finetune train: a fixed continuation is learned, generated for a new input, and llama.cpp agrees") {
  const Toy toy;
  const std::string traces = toy.fixed_traces("fixed.jsonl");
  const std::string adapter = (toy.dir.path / "toy-lora.gguf").string();
  // 12 traces, 3 held out: 9 steps per epoch, 8 epochs = 72 steps.
  const testing::ProcessResult r =
      toy.choreo({"finetune", "train", toy.workflow, "--traces", traces, "--rank", "4", "--alpha", "8", "--epochs", "8",
                  "--lr", "1e-2", "--val", "0.25", "--seed", "1", "-o", adapter, "-m", toy.model});
  INFO(r.out, r.err);
  REQUIRE(r.exit_code == 0);
  std::smatch match;
  REQUIRE(std::regex_search(r.out, match, std::regex(R"(validation loss ([0-9.]+)/token before, ([0-9.]+) after)")));
  const double before = std::stod(match[1]), after = std::stod(match[2]);
  MESSAGE("held-out log-loss per token: ", before, " before, ", after, " after 72 steps");
  CHECK(after < 0.25);  // the stated bound
  CHECK(after < before / 4);

  // The adapter generates the continuation for a name no trace had.
  const testing::ProcessResult run =
      toy.choreo({"run", toy.workflow, "--input", "name=Zed", "-m", toy.model, "--lora", adapter});
  INFO(run.err);
  REQUIRE(run.exit_code == 0);
  // (The run renders the first generated token, a lone space piece, as a space of its own.)
  const std::string out = output_of(run.out);
  CHECK(out.substr(out.find_first_not_of(' ')) == std::string(kContinuation).substr(1) + "\n");

  // llama.cpp loads the adapter and continues the same prompt the same way, greedy.
  const std::string prompt = "Zed went to the park. Then";
  const std::vector<testing::ReferenceRun> ref = testing::llama_cpp_reference(toy.model, {prompt}, 10, 0, 0, {{adapter, 1.0f}});
  REQUIRE(ref.size() == 1);
  const model::Model& m = *testing::stories260k().model;
  const model::LoraStack stack{{{model::LoraAdapter::load(adapter, m), 1.0f}}};
  kv::PagePool pool(m.backend(), m.kv_layout(32), size_t(64) << 20);
  model::Session s(m, pool);
  s.set_lora(&stack);
  std::vector<int32_t> tokens = m.vocab().tokenize(prompt, true, true);
  CHECK(tokens == ref[0].tokens);
  std::vector<float> logits;
  s.eval(tokens, &logits);
  std::vector<int32_t> greedy;
  for (int i = 0; i < 10; ++i) {
    const model::Token t = model::argmax(logits);
    if (t == m.vocab().eos()) break;
    greedy.push_back(t);
    s.eval(std::span<const model::Token>(&t, 1), &logits);
  }
  CHECK(greedy == ref[0].greedy);
  CHECK(m.vocab().detokenize(greedy) == kContinuation);
}

TEST_CASE("finetune train: bad input is exit 2 before any training step, and writes nothing") {
  const Toy toy;
  const std::string adapter = (toy.dir.path / "never.gguf").string();
  const auto train = [&](const std::string& traces, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"finetune", "train", toy.workflow, "--traces", traces, "-o", adapter, "-m", toy.model};
    args.insert(args.end(), extra.begin(), extra.end());
    return toy.choreo(args);
  };
  const std::string good = toy.fixed_traces("good.jsonl");
  const std::string empty = (toy.dir.path / "empty.jsonl").string();
  std::ofstream(empty).flush();
  const std::string other = toy.fixed_traces("other.jsonl", [](nlohmann::json& t) { t["calls"][0]["name"] = "reply"; });
  const std::string too_long = toy.fixed_traces("long.jsonl", [](nlohmann::json& t) {
    for (int i = 0; i < 20; ++i) t["calls"][0]["generated"].push_back(1);
  });
  const std::string broken = (toy.dir.path / "broken.jsonl").string();
  {
    std::ofstream out(broken);
    out << testing::read_file(good).substr(0, testing::read_file(good).find('\n') + 1) << "{\"line\": 2, \"calls\": 7}\n";
  }
  const struct {
    std::string traces;
    std::vector<std::string> extra;
    std::string says;
  } cases[] = {
      {good, {"--rank", "0"}, "--rank 0 is not positive"},
      {empty, {}, "no traces"},
      {other, {}, "does not match the workflow"},
      {too_long, {}, "more than its max_tokens of 10"},
      {broken, {}, "broken.jsonl:2"},
      {good, {"--layers", "3-1"}, "--layers '3-1' is not FIRST-LAST"},
      {good, {"--layers", "x"}, "--layers 'x' is not FIRST-LAST"},
      {good, {"--layers", "2-5"}, "the model has layers 0-4"},
  };
  for (const auto& c : cases) {
    const testing::ProcessResult r = train(c.traces, c.extra);
    CAPTURE(c.says);
    INFO(r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(c.says) != std::string::npos);
    CHECK(!std::filesystem::exists(adapter));
  }
}

TEST_CASE("finetune train: a run stopped after an epoch and resumed writes the adapter an uninterrupted run writes") {
  const Toy toy;
  const std::string traces = toy.fixed_traces("fixed.jsonl");
  const auto train = [&](const std::string& out, const std::string& epochs, std::vector<std::string> extra = {},
                         const std::string& rank = "2") {
    std::vector<std::string> args = {"finetune", "train", toy.workflow, "--traces", traces, "--rank", rank, "--epochs",
                                     epochs, "--lr", "1e-2", "--seed", "3", "-o", out, "-m", toy.model};
    args.insert(args.end(), extra.begin(), extra.end());
    return toy.choreo(args);
  };
  const std::string whole = (toy.dir.path / "whole.gguf").string(), parts = (toy.dir.path / "parts.gguf").string();
  REQUIRE(train(whole, "3").exit_code == 0);
  REQUIRE(train(parts, "1").exit_code == 0);
  CHECK(testing::read_file(parts) != testing::read_file(whole));
  const testing::ProcessResult resumed = train(parts, "3", {"--resume"});
  INFO(resumed.err);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.err.find("after epoch 1") != std::string::npos);
  CHECK(testing::read_file(parts) == testing::read_file(whole));
  // A checkpoint of other settings is refused; so is --resume with none.
  const testing::ProcessResult other = train(parts, "3", {"--resume"}, "3");
  CHECK(other.exit_code == 2);
  CHECK(other.err.find("--rank 2; this run has --rank 3") != std::string::npos);
  const testing::ProcessResult none = train((toy.dir.path / "none.gguf").string(), "3", {"--resume"});
  CHECK(none.exit_code == 2);
  CHECK(none.err.find("no checkpoint") != std::string::npos);
  // --layers: the adapter holds pairs of those layers only, and a checkpoint of all layers is not resumed with it.
  const std::string some = (toy.dir.path / "some.gguf").string();
  const testing::ProcessResult ranged = train(some, "1", {"--layers", "2-3"});
  INFO(ranged.err);
  REQUIRE(ranged.exit_code == 0);
  CHECK(ranged.out.find("layers 2-3") != std::string::npos);
  const gguf::File f = gguf::File::open(some);
  std::set<std::string> blocks;
  for (const gguf::TensorInfo& t : f.tensors()) blocks.insert(t.name.substr(0, t.name.find('.', 4)));
  CHECK(blocks == std::set<std::string>{"blk.2", "blk.3"});
  const testing::ProcessResult mixed = train(parts, "4", {"--resume", "--layers", "2-3"});
  CHECK(mixed.exit_code == 2);
  CHECK(mixed.err.find("--layers") != std::string::npos);
}

TEST_CASE("finetune train: activation recomputation writes the same adapter, and --val-traces validates on another file") {
  const Toy toy;
  const std::string traces = toy.fixed_traces("fixed.jsonl");
  const auto train = [&](const std::string& out, std::vector<std::string> extra) {
    std::vector<std::string> args = {"finetune", "train", toy.workflow, "--traces", traces, "--rank", "2", "--epochs",
                                     "2", "--lr", "1e-2", "--seed", "5", "-o", out, "-m", toy.model};
    args.insert(args.end(), extra.begin(), extra.end());
    return toy.choreo(args);
  };
  const std::string kept = (toy.dir.path / "kept.gguf").string(), recomputed = (toy.dir.path / "re.gguf").string();
  const testing::ProcessResult a = train(kept, {"--recompute", "off"});
  const testing::ProcessResult b = train(recomputed, {"--recompute", "on"});
  INFO(a.err, b.err);
  REQUIRE(a.exit_code == 0);
  REQUIRE(b.exit_code == 0);
  CHECK(a.err.find("activation recomputation") == std::string::npos);
  CHECK(b.err.find("11 traces with activation recomputation") != std::string::npos);
  CHECK(testing::read_file(recomputed) == testing::read_file(kept));
  // Validation on another file: its traces are the validation set, every trace of --traces trains.
  const std::string val = toy.fixed_traces("val.jsonl");
  const testing::ProcessResult c = train((toy.dir.path / "v.gguf").string(), {"--val-traces", val});
  INFO(c.err);
  REQUIRE(c.exit_code == 0);
  CHECK(c.err.find(fmt::format("{} training and {} validation traces", std::size(kNames), std::size(kNames))) !=
        std::string::npos);
  const testing::ProcessResult both = train((toy.dir.path / "w.gguf").string(), {"--val-traces", val, "--val", "0.2"});
  CHECK(both.exit_code == 2);
  CHECK(both.err.find("--val and --val-traces") != std::string::npos);
  // No validation traces: no validation loss is printed (it was "nan": issue 42, finding 12).
  const testing::ProcessResult none =
      toy.choreo({"finetune", "train", toy.workflow, "--traces", traces, "--rank", "2", "--epochs", "1",
                  "--val", "0", "-o", (toy.dir.path / "n.gguf").string(), "-m", toy.model});
  INFO(none.out, none.err);
  REQUIRE(none.exit_code == 0);
  CHECK(none.out.find("no validation traces (--val 0)") != std::string::npos);
  CHECK(none.err.find("no validation traces") != std::string::npos);
  for (const std::string& printed : {none.out, none.err}) {
    CHECK(printed.find("nan") == std::string::npos);
    CHECK(printed.find("validation loss") == std::string::npos);
  }
}

// A trace line that is not what `finetune traces` writes is named by its field and what that holds; the
// message was nlohmann's ("[json.exception.type_error.302] type must be number, but is string"), and a
// fractional token id was truncated to a token (issue 42, finding 12).
TEST_CASE("finetune traces files: a malformed trace names its field and what it holds, in choreo's words") {
  testing::ScratchDir dir;
  const std::string path = (dir.path / "t.jsonl").string();
  const int n_vocab = testing::stories260k().model->config().n_vocab;
  const struct {
    std::function<void(nlohmann::json&)> edit;
    std::string says;
  } cases[] = {
      {[](nlohmann::json& t) { t["line"] = "7"; }, "\"line\" is a string, not a whole number"},
      {[](nlohmann::json& t) { t["line"] = 0; }, "\"line\" is 0, outside 1..2147483647"},
      {[](nlohmann::json& t) { t["line"] = 1e10; }, "\"line\" is a number, not a whole number"},
      {[](nlohmann::json& t) { t.erase("inputs"); }, "there is no \"inputs\""},
      {[](nlohmann::json& t) { t["inputs"]["name"] = 3; },
       "\"inputs\" holds \"name\": an integer, not a string"},
      {[](nlohmann::json& t) { t["params"] = nlohmann::json::array(); },
       "\"params\" is a list, not an object"},
      {[](nlohmann::json& t) { t["max_steps"] = -1; }, "\"max_steps\" is -1, outside 1.."},
      {[](nlohmann::json& t) { t["calls"] = 7; }, "\"calls\" is an integer, not a list"},
      {[](nlohmann::json& t) { t["calls"][0] = "next"; }, "call 0: it is a string, not an object"},
      {[](nlohmann::json& t) { t["calls"][0].erase("name"); }, "call 0: there is no \"name\""},
      {[](nlohmann::json& t) { t["calls"][0]["generated"] = "abc"; },
       "call 0: \"generated\" is a string, not a list"},
      {[](nlohmann::json& t) { t["calls"][0]["generated"][2] = 1.5; },
       "call 'next': \"generated\" holds 1.5"},
      {[](nlohmann::json& t) { t["calls"][0]["generated"][2] = -1; },
       "has token -1, outside the model's vocabulary"},
      {[](nlohmann::json& t) { t["calls"][0]["generated"][2] = uint64_t(1) << 63; },
       "outside the model's vocabulary"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.says);
    testing::write_fixed_traces(path, [&](nlohmann::json& t) {
      if (t["line"] == 2) c.edit(t);
    });
    const std::string what = testing::input_error_text([&] { train::read_traces(path, n_vocab); });
    INFO(what);
    CHECK(what.find(path + ":2:1: not a trace: ") != std::string::npos);
    CHECK(what.find(c.says) != std::string::npos);
    CHECK(what.find("json.exception") == std::string::npos);
  }
  testing::write_fixed_traces(path);
  CHECK(train::read_traces(path, n_vocab).size() == std::size(kNames));  // the unedited file reads
}

TEST_CASE("finetune: the graph of a teacher-forced run has the engine's log-loss, in choreo and in prefix mode") {
  const model::Model& m = *testing::stories260k().model;
  const dsl::Workflow w = dsl::parse_workflow(testing::kReorderedWorkflow, "modes.yaml");
  train::Trace trace;
  {
    kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(64) << 20);
    runtime::Engine e(m, pool, runtime::Mode::Prefix);
    trace = train::sample_trace(w, e, {1, {}}, 1.0f, 7);  // sampled: not the model's greedy choices
  }
  const train::FrozenModel frozen = train::FrozenModel::dequantise(m);
  const train::LoraParams<float> none;
  for (const runtime::Mode mode : {runtime::Mode::Choreo, runtime::Mode::Prefix}) {
    CAPTURE(runtime::mode_name(mode));
    double engine_loss = 0;
    {
      kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(64) << 20);
      runtime::Engine e(m, pool, mode);
      exec::RunHooks hooks;
      hooks.forced_tokens = [&](const std::string& name) -> std::optional<std::vector<model::Token>> {
        for (const train::TraceCall& c : trace.calls)
          if (c.name == name) return c.generated;
        return std::nullopt;
      };
      hooks.record_logits = [](const std::string&) { return true; };
      const exec::RunResult r = exec::run_workflow(w, e, trace.arguments, hooks);
      for (const exec::MessageRecord& rec : r.messages) {
        if (rec.kind != "decode") continue;
        const std::vector<int32_t> generated(rec.tokens.end() - rec.n_generated, rec.tokens.end());
        REQUIRE(rec.logits.size() == generated.size());
        for (size_t i = 0; i < generated.size(); ++i)
          engine_loss += train::cross_entropy<float>(rec.logits[i].data(), 1, m.config().n_vocab, &generated[i], nullptr);
      }
    }
    kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(64) << 20);
    runtime::Engine e(m, pool, mode);
    train::Graph<float> g(frozen, none);
    for (const train::GraphMessage& msg : train::trace_messages(w, e, trace)) g.add(msg);
    const double graph_loss = g.forward();
    MESSAGE(runtime::mode_name(mode), ": engine log-loss ", engine_loss, ", graph ", graph_loss);
    CHECK(graph_loss == doctest::Approx(engine_loss).epsilon(1e-4));
  }
}

}  // namespace
}  // namespace choreo
