#include "runtime/train/finetune.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "common/clock.h"
#include "common/error.h"
#include "dsl/workflow_parser.h"
#include "runtime/eval/results.h"
#include "runtime/exec/interpreter.h"
#include "runtime/exec/json_line.h"

namespace choreo::train {

nlohmann::json trace_json(const Trace& trace) {
  nlohmann::json calls = nlohmann::json::array();
  for (const TraceCall& c : trace.calls) calls.push_back({{"name", c.name}, {"generated", c.generated}});
  return {{"line", trace.line},
          {"inputs", trace.arguments.inputs},
          {"params", trace.arguments.params},
          {"max_steps", trace.arguments.max_steps},
          {"calls", std::move(calls)}};
}

namespace {

/// The fields of one trace line, read as `finetune traces` writes them; anything else is an InputError (made
/// by `bad`) that names the field and what it holds, never nlohmann's words.
class TraceReader {
 public:
  TraceReader(const nlohmann::json& value, std::function<InputError(const std::string&)> bad)
      : value_(value), bad_(std::move(bad)) {}

  const nlohmann::json& field(const nlohmann::json& object, const char* key,
                              std::string_view owner = {}) const {
    const auto it = object.find(key);
    if (it == object.end()) throw bad_(fmt::format("{}there is no \"{}\"", owner, key));
    return *it;
  }
  /// A whole number in [low, high] (`name` as errors quote it).
  int64_t integer(const nlohmann::json& v, const std::string& name, int64_t low, int64_t high) const {
    if (!v.is_number_integer())
      throw bad_(fmt::format("{} is {}, not a whole number", name, exec::type_name(v)));
    if (!inside(v, low, high)) throw bad_(fmt::format("{} is {}, outside {}..{}", name, v.dump(), low, high));
    return v.get<int64_t>();
  }
  std::map<std::string, std::string> strings(const char* key) const {
    const nlohmann::json& v = field(value_, key);
    if (!v.is_object())
      throw bad_(fmt::format("\"{}\" is {}, not an object of strings", key, exec::type_name(v)));
    std::map<std::string, std::string> out;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!it->is_string())
        throw bad_(fmt::format("\"{}\" holds \"{}\": {}, not a string", key, it.key(), exec::type_name(*it)));
      out.emplace(it.key(), it->get<std::string>());
    }
    return out;
  }
  TraceCall call(const nlohmann::json& c, size_t k, int n_vocab) const {
    const std::string owner = fmt::format("call {}: ", k);
    if (!c.is_object()) throw bad_(fmt::format("{}it is {}, not an object", owner, exec::type_name(c)));
    const nlohmann::json& name = field(c, "name", owner);
    if (!name.is_string())
      throw bad_(fmt::format("{}\"name\" is {}, not a string", owner, exec::type_name(name)));
    const nlohmann::json& generated = field(c, "generated", owner);
    if (!generated.is_array())
      throw bad_(
          fmt::format("{}\"generated\" is {}, not a list of token ids", owner, exec::type_name(generated)));
    TraceCall call{name.get<std::string>(), {}};
    for (const nlohmann::json& token : generated) {
      if (!token.is_number_integer())
        throw bad_(fmt::format("call '{}': \"generated\" holds {}, not a token id", call.name, token.dump()));
      if (!inside(token, 0, n_vocab - 1))
        throw bad_(fmt::format("call '{}' has token {}, outside the model's vocabulary of {}", call.name,
                               token.dump(), n_vocab));
      call.generated.push_back(int32_t(token.get<int64_t>()));
    }
    return call;
  }

 private:
  /// Whether the integer `v` is in [low, high]; nlohmann keeps integers past int64's range as unsigned.
  static bool inside(const nlohmann::json& v, int64_t low, int64_t high) {
    if (v.is_number_unsigned())
      return v.get<uint64_t>() <= uint64_t(high) && int64_t(v.get<uint64_t>()) >= low;
    return v.get<int64_t>() >= low && v.get<int64_t>() <= high;
  }

  const nlohmann::json& value_;
  std::function<InputError(const std::string&)> bad_;
};

}  // namespace

std::vector<Trace> read_traces(const std::string& path, int n_vocab) {
  const eval::JsonLinesFile file = eval::read_json_lines(path, kTraceLines);
  std::vector<Trace> out;
  for (size_t i = 0; i < file.values.size(); ++i) {
    const nlohmann::json& v = file.values[i];
    const SourceLocation at{path, file.lines[i], 1};
    const auto bad = [&](const std::string& what) {
      return InputError(fmt::format("not a trace: {}", what),
                        "traces files are written by `choreo finetune traces WF.yaml --inputs ROWS.jsonl -o T.jsonl`",
                        at);
    };
    if (!v.is_object()) throw bad("the line is not a JSON object");
    const TraceReader r(v, bad);
    Trace t;
    t.line = int(r.integer(r.field(v, "line"), "\"line\"", 1, std::numeric_limits<int>::max()));
    t.arguments.inputs = r.strings("inputs");
    t.arguments.params = r.strings("params");
    t.arguments.max_steps =
        r.integer(r.field(v, "max_steps"), "\"max_steps\"", 1, std::numeric_limits<int64_t>::max());
    const nlohmann::json& calls = r.field(v, "calls");
    if (!calls.is_array()) throw bad(fmt::format("\"calls\" is {}, not a list", exec::type_name(calls)));
    for (size_t k = 0; k < calls.size(); ++k) t.calls.push_back(r.call(calls[k], k, n_vocab));
    if (t.calls.empty()) throw bad("it has no decode calls");
    out.push_back(std::move(t));
  }
  if (out.empty())
    throw InputError(fmt::format("{}: no traces", path), "sample some with `choreo finetune traces`", {path, 1, 1});
  return out;
}

Trace sample_trace(const dsl::Workflow& workflow, runtime::Engine& engine, const exec::InputRow& row,
                   float temperature, uint64_t seed) {
  exec::RunHooks hooks;
  hooks.sampling = [&](const std::string& name, model::SamplingParams& s) {
    s.temperature = temperature;
    const uint64_t parts[] = {seed, uint64_t(row.line), XXH3_64bits(name.data(), name.size())};
    s.seed = XXH3_64bits(parts, sizeof(parts));
  };
  const exec::RunResult r = exec::run_workflow(workflow, engine, row.arguments, hooks);
  Trace t{row.line, row.arguments, {}};
  for (const exec::MessageRecord& m : r.messages)
    if (m.kind == "decode")
      t.calls.push_back({m.name, std::vector<int32_t>(m.tokens.end() - m.n_generated, m.tokens.end())});
  return t;
}

std::vector<GraphMessage> trace_messages(const dsl::Workflow& workflow, runtime::Engine& engine, const Trace& trace) {
  std::map<std::string, const TraceCall*> by_name;
  for (const TraceCall& c : trace.calls)
    if (!by_name.emplace(c.name, &c).second)
      throw InputError(fmt::format("trace of line {} names the call '{}' twice", trace.line, c.name));
  std::set<std::string> missing;
  exec::RunHooks hooks;
  hooks.forced_tokens = [&](const std::string& name) -> std::optional<std::vector<model::Token>> {
    const auto it = by_name.find(name);
    if (it == by_name.end()) {
      missing.insert(name);
      return std::nullopt;  // sampled as the workflow says; reported after the run
    }
    return it->second->generated;
  };
  const exec::RunResult r = exec::run_workflow(workflow, engine, trace.arguments, hooks);
  if (!missing.empty())
    throw InputError(fmt::format("the trace of line {} does not match the workflow: it has no call '{}'",
                                 trace.line, *missing.begin()),
                     "sample the traces again with this workflow (`choreo finetune traces`)");
  std::vector<const exec::MessageRecord*> decodes;
  for (const exec::MessageRecord& m : r.messages)
    if (m.kind == "decode") decodes.push_back(&m);
  for (const TraceCall& c : trace.calls)
    if (std::none_of(decodes.begin(), decodes.end(), [&](const auto* m) { return m->name == c.name; }))
      throw InputError(fmt::format("the trace of line {} does not match the workflow: the run made no call '{}'",
                                   trace.line, c.name),
                       "sample the traces again with this workflow (`choreo finetune traces`)");

  std::vector<GraphMessage> out;
  if (engine.mode() != runtime::Mode::Choreo) {
    // The baseline (prefix or naive mode): every decode is a plain chat call, its parents' text in list order,
    // then its header and what it generated, after the BOS. (Prefix caching reuses identical encodings, so
    // the numbers are those of encoding the flat prompt.)
    std::map<std::string, const exec::MessageRecord*> by_record;
    for (const exec::MessageRecord& m : r.messages) by_record[m.name] = &m;
    const kv::MessageId bos_id = engine.bos(0);
    int bos = -1;
    if (bos_id != kv::kNoMessage) {
      GraphMessage b;
      b.tokens = engine.store().record(bos_id).tokens;
      out.push_back(std::move(b));
      bos = 0;
    }
    for (const exec::MessageRecord* d : decodes) {
      GraphMessage g;
      for (const std::string& parent : d->parents) {
        const auto it = by_record.find(parent);
        if (it == by_record.end())
          throw InputError(fmt::format("call '{}' of line {} reads '{}', which the run did not record", d->name,
                                       trace.line, parent));
        g.tokens.insert(g.tokens.end(), it->second->tokens.begin(), it->second->tokens.end());
      }
      g.tokens.insert(g.tokens.end(), d->tokens.begin(), d->tokens.end());
      g.start_pos = engine.first_pos();
      if (bos >= 0) g.parents.push_back({bos, 0, -1});
      g.targets.assign(g.tokens.size(), -1);
      for (size_t k = g.tokens.size() - size_t(d->n_generated); k < g.tokens.size(); ++k)
        if (k > 0) g.targets[k - 1] = g.tokens[k];
      out.push_back(std::move(g));
    }
    return out;
  }
  // Every message the decodes read, parents first; engine ids -> graph indices.
  std::map<kv::MessageId, int> index;
  const kv::MessageStore& store = engine.store();
  const std::function<int(kv::MessageId)> add = [&](kv::MessageId id) -> int {
    if (const auto it = index.find(id); it != index.end()) return it->second;
    const kv::Message& m = store.record(id);
    if (m.variant != 0 || m.model != 0)
      throw InputError("choreo finetune trains workflows on one model (the run's); this one reads another model's messages",
                       "remove `models:` and `model:` from the workflow");
    GraphMessage g;
    g.tokens = m.tokens;
    g.start_pos = m.start_pos;
    const kv::MessageId bos = engine.bos(m.model);
    if (bos != kv::kNoMessage && id != bos) g.parents.push_back({add(bos), 0, -1});
    for (const kv::PlacedParent& p : m.parents)
      g.parents.push_back({add(p.message), p.offset, p.n_tokens >= 0 ? p.n_tokens : -1});
    out.push_back(std::move(g));
    return index[id] = int(out.size()) - 1;
  };
  for (const exec::MessageRecord* d : decodes) {
    const int i = add(d->id);
    GraphMessage& g = out[size_t(i)];
    if (g.tokens.size() != d->tokens.size())
      throw InputError(fmt::format("call '{}' of line {} was encoded with {} tokens, its record has {}", d->name,
                                   trace.line, g.tokens.size(), d->tokens.size()));
    g.targets.assign(g.tokens.size(), -1);
    const size_t header = g.tokens.size() - size_t(d->n_generated);
    for (size_t k = header; k < g.tokens.size(); ++k)
      if (k > 0) g.targets[k - 1] = g.tokens[k];
  }
  return out;
}

SampleTracesReport sample_traces(const SampleTracesOptions& o) {
  if (!(o.temperature >= 0.0f) || !std::isfinite(o.temperature))
    throw InputError(fmt::format("--temperature {} is not a finite number of at least 0", o.temperature));
  const dsl::Workflow workflow = load_single_model_workflow(o.workflow_path);
  std::vector<exec::InputRow> rows = exec::read_input_rows(o.inputs_path, workflow, o.shared);
  if (o.limit >= 0 && size_t(o.limit) < rows.size()) rows.resize(size_t(o.limit));
  std::vector<exec::InputRow> mine;
  for (size_t i = 0; i < rows.size(); ++i)
    if (eval::in_shard(i, o.shard)) mine.push_back(rows[i]);
  // Resuming: rows already in the output are skipped (a torn last line is cut off and sampled again).
  std::set<int> done;
  for (const nlohmann::json& v : eval::read_json_lines(o.out_path, kTraceLines).values)
    if (v.is_object() && v.contains("line") && v["line"].is_number_integer()) done.insert(v["line"].get<int>());
  const std::shared_ptr<runtime::LoadedModels> loaded = runtime::load_models(o.models);
  eval::LineAppender out(o.out_path, "-o", kTraceLines);
  SampleTracesReport report;
  report.n_rows = mine.size();
  const double start = steady_ms();
  for (const exec::InputRow& row : mine) {
    if (done.contains(row.line)) {
      ++report.skipped;
      continue;
    }
    SampledRow sampled{row.line, 0, mine.size()};
    // The paper's baseline: every call a plain prefix-cached chat call.
    const std::unique_ptr<runtime::OpenedEngine> opened = open_scratch_engine(loaded, runtime::Mode::Prefix);
    std::optional<Trace> trace;
    std::optional<InputError> error;
    try {
      trace = sample_trace(workflow, opened->engine(), row, o.temperature, o.seed);
    } catch (const InputError& e) {
      // As eval does: the row's error, then the other rows; nothing is written for it, so a rerun retries it.
      ++report.failed;
      error = e;
      sampled.error = &*error;
    }
    if (trace) {
      out.append(trace_json(*trace).dump() + "\n");
      ++report.written;
      sampled.trace = &*trace;
    }
    sampled.done = report.written + report.skipped + report.failed;
    sampled.seconds = (steady_ms() - start) / 1000.0;
    if (o.on_row) o.on_row(sampled);
  }
  return report;
}

dsl::Workflow load_single_model_workflow(const std::string& path) {
  dsl::Workflow w = dsl::load_workflow(path);
  if (!w.models.empty())
    throw InputError(fmt::format("{}: choreo finetune trains workflows on one model; this one declares models:", path),
                     "remove `models:` and `model:` (the adapter trained is the model every call runs with)");
  return w;
}

std::unique_ptr<runtime::OpenedEngine> open_scratch_engine(std::shared_ptr<const runtime::LoadedModels> models,
                                                           runtime::Mode mode) {
  runtime::EngineOptions options;
  options.mode = mode;
  options.t0_bytes = kv::budget_within_device(*models->backend, size_t(2048) << 20);
  return runtime::open_engine(std::move(models), options);
}

}  // namespace choreo::train
