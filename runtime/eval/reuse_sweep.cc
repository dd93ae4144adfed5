#include "runtime/eval/reuse_sweep.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/error.h"
#include "kernels/backend.h"
#include "runtime/eval/dataset.h"
#include "runtime/eval/results.h"
#include "runtime/eval/reuse_profile.h"
#include "runtime/exec/reuse_plan_file.h"
#include "runtime/model/gguf.h"
#include "runtime/model/lora.h"

namespace choreo::eval {

namespace {

using runtime::CrossModelPlan;

/// A sender or receiver spec: `default` (the base model with its adapters), an adapter GGUF
/// (`general.type = adapter`) over the base model, or another GGUF of its architecture.
int add_model(runtime::ModelSet& set, const std::string& spec, double scale, const std::string& name,
              const model::Model& base, std::vector<std::unique_ptr<model::Model>>& owned) {
  if (spec == "default") return 0;
  gguf::File file = gguf::File::open(spec);
  if (file.get_string("general.type", "") == "adapter") {
    model::LoraStack lora{{{model::LoraAdapter::load(std::move(file), base), float(scale)}}};
    return set.add(name, base, std::move(lora));
  }
  owned.push_back(model::Model::load(spec, base.backend()));
  return set.add(name, *owned.back());
}

std::string hex(uint64_t v) { return fmt::format("{:016x}", v); }

PlanScore to_score(const CrossModelPlan& plan, int n_layers) {
  PlanScore s;
  if (plan.kind == CrossModelPlan::Kind::Recompute) s.ranges = {{0, n_layers}};
  for (const runtime::LayerRange& r : plan.ranges)
    if (r.begin < r.end) s.ranges.push_back(r);
  return s;
}

/// Means of runs into a score.
void add_run(PlanScore& s, const PlanRun& r) {
  const double n = s.n;
  const auto mix = [&](double& mean, double x) { mean = (mean * n + x) / (n + 1); };
  mix(s.token_f1, r.token_f1);
  mix(s.kl, r.kl);
  mix(s.metric, r.metric);
  mix(s.prefill_ms, r.ttft_ms);
  ++s.n;
}

nlohmann::ordered_json run_json(const std::string& split, const std::string& item, const std::string& plan,
                                const PlanRun& r) {
  return {{"split", split},     {"item", item},           {"plan", plan},
          {"text", r.text},     {"token_f1", r.token_f1}, {"kl", r.kl},
          {"metric", r.metric}, {"ttft_ms", r.ttft_ms},   {"e_recomputed", r.n_e_recomputed}};
}

/// runs.jsonl: a config line, then one line per (split, item, plan) measured; resuming reads it back (a line
/// cut short by an interrupted run is dropped, and measured again).
class RunLog {
 public:
  /// A config line first, then run_json's lines.
  static inline const AppendedLines kLines{"reuse profile log", {R"({"config":)", R"({"split":)"}};

  RunLog(const std::string& path, const nlohmann::ordered_json& config, bool resume)
      : existing_(read_existing(path, resume)), out_(path, "-o", kLines) {
    if (existing_.values.empty()) {
      out_.append(run_line({{"config", config}}));
      return;
    }
    if (!existing_.values[0].contains("config") || existing_.values[0]["config"] != nlohmann::json(config))
      throw InputError(fmt::format("{} was measured with other settings", path),
                       "resume with the same models, data and flags, or give another -o directory");
    for (size_t i = 1; i < existing_.values.size(); ++i) {
      const nlohmann::json& j = existing_.values[i];
      done_[key(j.value("split", ""), j.value("item", ""), j.value("plan", ""))] =
          PlanRun{j.value("text", ""),    j.value("token_f1", 0.0), j.value("kl", 0.0),
                  j.value("metric", 0.0), j.value("ttft_ms", 0.0),  j.value("e_recomputed", 0)};
    }
    existing_ = {};  // read into done_
  }
  const PlanRun* find(const std::string& split, const std::string& item, const std::string& plan) const {
    const auto it = done_.find(key(split, item, plan));
    return it == done_.end() ? nullptr : &it->second;
  }
  void add(const std::string& split, const std::string& item, const std::string& plan, const PlanRun& r) {
    done_[key(split, item, plan)] = r;
    out_.append(run_line(run_json(split, item, plan, r)));
  }
  size_t n_resumed() const { return done_.size(); }

 private:
  static JsonLinesFile read_existing(const std::string& path, bool resume) {
    std::error_code ec;
    if (std::filesystem::exists(path, ec) && !resume)
      throw InputError(fmt::format("{} exists: an earlier profile's measurements", path),
                       "add --resume to continue it, or give another -o directory");
    return read_json_lines(path, kLines);
  }
  static std::string key(const std::string& a, const std::string& b, const std::string& c) {
    return a + '\x1f' + b + '\x1f' + c;
  }
  static std::string run_line(const nlohmann::ordered_json& j) {
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  }
  JsonLinesFile existing_;
  LineAppender out_;
  std::map<std::string, PlanRun> done_;
};

/// What the sweep runs on: the runner, its log, the layers, and who to tell how far it is.
struct Sweep {
  ReuseRunner& runner;
  RunLog& log;
  int n_layers;
  const std::function<void(const ReuseSweepProgress&)>& on_item;

  /// Scores `plans` on `items`, each item's missing runs measured (its reference first), the rest read from
  /// the log. Returns one score per plan, the reference (recompute) first.
  std::vector<PlanScore> score(const std::string& split, const std::vector<ReuseItem>& items,
                               const std::vector<CrossModelPlan>& plans) {
    std::vector<PlanScore> scores{to_score({}, n_layers)};
    for (const CrossModelPlan& p : plans) scores.push_back(to_score(p, n_layers));
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < items.size(); ++i) {
      const ReuseItem& item = items[i];
      // An item with a plan missing from the log measures its reference again first: plans are scored against
      // the reference's logits, which the log does not keep.
      bool complete = log.find(split, item.id, "recompute");
      for (const CrossModelPlan& p : plans) complete = complete && log.find(split, item.id, p.describe());
      if (!complete) log.add(split, item.id, "recompute", runner.start(item));
      add_run(scores[0], *log.find(split, item.id, "recompute"));
      for (size_t k = 0; k < plans.size(); ++k) {
        const std::string name = plans[k].describe();
        if (!log.find(split, item.id, name)) log.add(split, item.id, name, runner.run(plans[k]));
        add_run(scores[k + 1], *log.find(split, item.id, name));
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (on_item) on_item({split, i + 1, items.size(), item.id, plans.size() + 1, s, complete});
    }
    return scores;
  }
};

std::vector<double> losses_of(Quality q, const std::vector<PlanScore>& scores) {
  std::vector<double> out;
  for (const PlanScore& s : scores) out.push_back(quality_loss(q, s, scores.front()));
  return out;
}

CrossModelPlan plan_of(const PlanScore& s, int n_layers) {
  if (s.ranges.size() == 1 && s.ranges[0].begin == 0 && s.ranges[0].end == n_layers) return {};
  if (s.ranges.empty()) return {CrossModelPlan::Kind::Reuse, {}};
  return {CrossModelPlan::Kind::Partial, s.ranges};
}

nlohmann::ordered_json summary_json(const PlanScore& s, const PlanScore& reference, Quality q) {
  return {{"n", s.n},
          {"loss", quality_loss(q, s, reference)},
          {"token_f1", s.token_f1},
          {"kl", s.kl},
          {"metric", s.metric},
          {"metric_recompute", reference.metric},
          {"prefill_ms", s.prefill_ms},
          {"prefill_ms_recompute", reference.prefill_ms},
          {"speedup", s.prefill_ms > 0 ? reference.prefill_ms / s.prefill_ms : 0.0}};
}

void check_options(const ReuseSweepOptions& o) {
  if (o.receiver.empty())
    throw InputError("--receiver is required", "name the model that reads: default or a GGUF");
  if (!(o.max_loss >= 0))
    throw InputError(fmt::format("--max-loss {}: a loss budget is a number >= 0", o.max_loss),
                     "0 keeps only plans as good as recompute; --quality says what the loss is");
  if (o.split_percent < 1 || o.split_percent > 99)
    throw InputError(fmt::format("--split {}: the training share must be 1 to 99 percent", o.split_percent));
}

/// The base model, the sender and the receiver, in one set.
struct SweepModels {
  std::shared_ptr<runtime::LoadedModels> loaded;
  int sender = 0, receiver = 0;
};

SweepModels load_sweep_models(const ReuseSweepOptions& o) {
  SweepModels m;
  runtime::ModelOptions model_options = o.models;
  model_options.add_models = [&](const model::Model& base, runtime::ModelSet& set,
                                 runtime::ExtraModels& extra) {
    m.sender = add_model(set, o.sender, o.sender_scale, "sender", base, extra.owned);
    m.receiver = add_model(set, o.receiver, o.receiver_scale, "receiver", base, extra.owned);
  };
  m.loaded = runtime::load_models(model_options);
  const runtime::ModelSet& set = m.loaded->models();
  if (set[size_t(m.sender)].fingerprint == set[size_t(m.receiver)].fingerprint)
    throw InputError("the sender and the receiver are the same model: every plan would read its own KV",
                     "profile two different models (another adapter, scale or GGUF)");
  return m;
}

/// Reuse, the sweep's ranges, and with `critical` every single layer (the critical-layer plan ranks them).
std::vector<CrossModelPlan> plans_to_sweep(const ReuseSweepOptions& o, int n_layers) {
  std::vector<CrossModelPlan> plans{{CrossModelPlan::Kind::Reuse, {}}};
  for (CrossModelPlan& p : sweep_plans(n_layers, o.step, o.max_span)) plans.push_back(std::move(p));
  if (o.critical)
    for (int l = 0; l < n_layers; ++l)
      if (std::none_of(plans.begin(), plans.end(), [&](const CrossModelPlan& p) {
            return p.ranges.size() == 1 && p.ranges[0].begin == l && p.ranges[0].end == l + 1;
          }))
        plans.push_back(CrossModelPlan::partial(l, l + 1));
  return plans;
}

/// The models, data and settings the log was measured with: resuming needs the same.
nlohmann::ordered_json log_config(const ReuseSweepOptions& o, const SweepModels& m, size_t n_items,
                                  size_t n_train) {
  const runtime::ModelSet& set = m.loaded->models();
  return {{"model", m.loaded->model().file().path()},
          {"sender",
           {{"spec", o.sender},
            {"scale", o.sender_scale},
            {"fingerprint", hex(set[size_t(m.sender)].fingerprint)}}},
          {"receiver",
           {{"spec", o.receiver},
            {"scale", o.receiver_scale},
            {"fingerprint", hex(set[size_t(m.receiver)].fingerprint)}}},
          {"data", o.data_path},
          {"items", n_items},
          {"train", n_train},
          {"max_tokens", o.max_tokens},
          {"context_tokens", o.context_tokens},
          {"kv", fmt::format("{}/{}", kernels::kv_type_name(o.engine.k_type),
                             kernels::kv_type_name(o.engine.v_type))}};
}

/// DroidSpeak Fig. 11: the chosen number of layers, as the individually most useful ones instead of one range
/// (with `critical`, when the chosen plan is one range).
std::optional<CrossModelPlan> critical_plan_of(const ReuseSweepOptions& o, const ReuseSweep& r) {
  const CrossModelPlan& chosen = r.chosen_plan;
  if (!o.critical || chosen.kind != CrossModelPlan::Kind::Partial || chosen.ranges.size() != 1)
    return std::nullopt;
  std::vector<double> single(size_t(r.n_layers), NAN);
  for (size_t i = 0; i < r.scores.size(); ++i)
    if (r.scores[i].ranges.size() == 1 && r.scores[i].ranges[0].end == r.scores[i].ranges[0].begin + 1)
      single[size_t(r.scores[i].ranges[0].begin)] = r.losses[i];
  return critical_layers_plan(single, chosen.recomputed_layers(r.n_layers));
}

/// The chosen plan on the held-out split, beside reuse (and the critical layers).
std::vector<CrossModelPlan> held_out_plans(const ReuseSweep& r) {
  std::vector<CrossModelPlan> check;
  if (r.chosen_plan.kind != CrossModelPlan::Kind::Recompute) check.push_back(r.chosen_plan);
  if (r.chosen_plan.kind != CrossModelPlan::Kind::Reuse) check.push_back({CrossModelPlan::Kind::Reuse, {}});
  if (r.critical_plan) check.push_back(*r.critical_plan);
  return check;
}

/// Every plan's scores, the heatmap, the frontier, and the plan file.
void write_files(const ReuseSweepOptions& o, const ReuseSweep& r, const nlohmann::ordered_json& config) {
  const std::filesystem::path dir = o.out_dir;
  const int n_layers = r.n_layers;
  const auto short_name = [](const std::string& spec) {
    return std::filesystem::path(spec).filename().string();
  };
  const std::string title = fmt::format("{} reading {}: {} loss, {} training items", short_name(o.receiver),
                                        short_name(o.sender), quality_name(o.quality), r.n_train);
  write_file_atomically((dir / "plans.json").string(),
                        plans_json(r.scores, r.losses, n_layers).dump(2) + "\n");
  write_file_atomically((dir / "heatmap.svg").string(),
                        heatmap_svg(r.scores, r.losses, n_layers, o.quality, r.chosen, title));
  write_file_atomically((dir / "frontier.svg").string(),
                        frontier_svg(r.scores, r.losses, r.frontier, n_layers, o.quality, r.chosen, title));
  std::vector<PlanScore> front;
  std::vector<double> front_losses;
  for (size_t i : r.frontier) {
    front.push_back(r.scores[i]);
    front_losses.push_back(r.losses[i]);
  }
  write_file_atomically((dir / "frontier.json").string(),
                        plans_json(front, front_losses, n_layers).dump(2) + "\n");
  const PlanScore& held_chosen =
      r.chosen_plan.kind == CrossModelPlan::Kind::Recompute ? r.held_out[0] : r.held_out[1];
  nlohmann::ordered_json plan_file =
      exec::reuse_plan_json(config["sender"], config["receiver"], n_layers, r.chosen_plan);
  plan_file.update(
      nlohmann::ordered_json{{"quality", quality_name(o.quality)},
                             {"max_loss", o.max_loss},
                             {"train", summary_json(r.scores[r.chosen.value_or(0)], r.scores[0], o.quality)},
                             {"held_out", summary_json(held_chosen, r.held_out[0], o.quality)}});
  if (r.critical_plan)
    plan_file["critical_layers"] = {
        {"plan", r.critical_plan->describe()},
        {"train", summary_json(r.critical_train[1], r.critical_train[0], o.quality)},
        {"held_out", summary_json(r.held_out.back(), r.held_out[0], o.quality)}};
  write_file_atomically((dir / "plan.json").string(), plan_file.dump(2) + "\n");
}

}  // namespace

ReuseSweep run_reuse_sweep(const ReuseSweepOptions& o) {
  check_options(o);
  const Dataset data = load_dataset(o.data_path);
  const SweepModels models = load_sweep_models(o);
  const model::Model& base = models.loaded->model();
  ReuseSweep r;
  r.n_layers = base.config().n_layers;
  std::vector<ReuseItem> items = reuse_items(data, base, o.context_tokens);
  if (o.limit > 0 && int(items.size()) > o.limit) items.resize(size_t(o.limit));
  if (items.size() < 2)
    throw InputError("the reuse profiler needs at least 2 items (a training and a held-out split)");
  r.n_train = std::clamp<size_t>(size_t(std::lround(double(items.size()) * o.split_percent / 100.0)), 1,
                                 items.size() - 1);
  r.n_held_out = items.size() - r.n_train;
  const std::vector<ReuseItem> train(items.begin(), items.begin() + std::ptrdiff_t(r.n_train));
  const std::vector<ReuseItem> held_out(items.begin() + std::ptrdiff_t(r.n_train), items.end());

  const std::vector<CrossModelPlan> plans = plans_to_sweep(o, r.n_layers);
  // Every plan of the sweep reads the passages encoded once: the sender saves its hidden state at the first
  // layer of each plan's ranges (with --critical, every layer: the critical-layer plan's ranges start there).
  std::vector<int> e_layers;
  for (const CrossModelPlan& p : plans)
    for (const runtime::LayerRange& range : p.ranges) e_layers.push_back(range.begin);
  runtime::ModelSet set = models.loaded->models();
  set.save_e_caches(models.sender, e_layers);

  std::filesystem::create_directories(o.out_dir);
  const nlohmann::ordered_json config = log_config(o, models, items.size(), r.n_train);
  RunLog log((std::filesystem::path(o.out_dir) / "runs.jsonl").string(), config, o.resume);
  if (log.n_resumed() > 0 && o.on_resume) o.on_resume(log.n_resumed());
  runtime::EngineOptions engine = o.engine;
  engine.mode = runtime::Mode::Choreo;
  ReuseRunner runner(set, models.sender, models.receiver, engine, data.metric, o.max_tokens);
  Sweep sweep{runner, log, r.n_layers, o.on_item};

  r.scores = sweep.score("train", train, plans);
  r.losses = losses_of(o.quality, r.scores);
  r.chosen = choose_plan(r.scores, r.losses, o.max_loss);
  r.frontier = pareto_frontier(r.scores, r.losses);
  r.chosen_plan = plan_of(r.scores[r.chosen.value_or(0)], r.n_layers);
  r.critical_plan = critical_plan_of(o, r);
  if (r.critical_plan) r.critical_train = sweep.score("train", train, {*r.critical_plan});
  r.held_out = sweep.score("held_out", held_out, held_out_plans(r));
  write_files(o, r, config);
  return r;
}

}  // namespace choreo::eval
