// `choreo profile reuse`: sweeps DroidSpeak cross-model plans for one (sender, receiver) pair on a dataset's
// training split, scores each against recompute, writes the heatmap, the Pareto frontier and a plan file, and
// checks the chosen plan on the held-out split (docs/profile.md, "Reuse plans").

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "cli/engine_flags.h"
#include "common/atomic_file.h"
#include "common/error.h"
#include "runtime/eval/dataset.h"
#include "runtime/eval/results.h"
#include "runtime/eval/reuse_report.h"
#include "runtime/eval/reuse_profile.h"
#include "runtime/exec/reuse_plan_file.h"
#include "runtime/model/gguf.h"
#include "runtime/model/lora.h"

namespace choreo::cli {

namespace {

struct ReuseOptions {
  std::string sender = "default", receiver, data_path, out_dir, quality = "f1";
  double sender_scale = 1, receiver_scale = 1;
  EngineFlags engine;
  int split = 50, limit = 20, step = 1, max_span = 0, max_tokens = 16, context_tokens = 1024;
  double max_loss = 0.05;
  bool critical = false, resume = false;
};

/// A `--sender`/`--receiver` model: `default` (-m with its --lora adapters), an adapter GGUF
/// (`general.type = adapter`) over -m, or another GGUF of -m's architecture.
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

eval::PlanScore to_score(const runtime::CrossModelPlan& plan, int n_layers) {
  eval::PlanScore s;
  if (plan.kind == runtime::CrossModelPlan::Kind::Recompute) s.ranges = {{0, n_layers}};
  for (const runtime::LayerRange& r : plan.ranges)
    if (r.begin < r.end) s.ranges.push_back(r);
  return s;
}

/// Means of runs into a score.
void add_run(eval::PlanScore& s, const eval::PlanRun& r) {
  const double n = s.n;
  const auto mix = [&](double& mean, double x) { mean = (mean * n + x) / (n + 1); };
  mix(s.token_f1, r.token_f1);
  mix(s.kl, r.kl);
  mix(s.metric, r.metric);
  mix(s.prefill_ms, r.ttft_ms);
  ++s.n;
}

nlohmann::ordered_json run_json(const std::string& split, const std::string& item, const std::string& plan,
                                const eval::PlanRun& r) {
  return {{"split", split}, {"item", item},  {"plan", plan},     {"text", r.text},
          {"token_f1", r.token_f1}, {"kl", r.kl}, {"metric", r.metric}, {"ttft_ms", r.ttft_ms},
          {"e_recomputed", r.n_e_recomputed}};
}

/// runs.jsonl: a config line, then one line per (split, item, plan) measured; --resume reads it back (a line
/// cut short by an interrupted run is dropped, and measured again).
class RunLog {
 public:
  /// A config line first, then run_json's lines.
  static inline const eval::AppendedLines kLines{"reuse profile log", {R"({"config":)", R"({"split":)"}};

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
          eval::PlanRun{j.value("text", ""),     j.value("token_f1", 0.0), j.value("kl", 0.0),
                        j.value("metric", 0.0), j.value("ttft_ms", 0.0),  j.value("e_recomputed", 0)};
    }
    existing_ = {};  // read into done_
  }
  const eval::PlanRun* find(const std::string& split, const std::string& item, const std::string& plan) const {
    const auto it = done_.find(key(split, item, plan));
    return it == done_.end() ? nullptr : &it->second;
  }
  void add(const std::string& split, const std::string& item, const std::string& plan, const eval::PlanRun& r) {
    done_[key(split, item, plan)] = r;
    out_.append(run_line(run_json(split, item, plan, r)));
  }
  size_t n_resumed() const { return done_.size(); }

 private:
  static eval::JsonLinesFile read_existing(const std::string& path, bool resume) {
    std::error_code ec;
    if (std::filesystem::exists(path, ec) && !resume)
      throw InputError(fmt::format("{} exists: an earlier profile's measurements", path),
                       "add --resume to continue it, or give another -o directory");
    return eval::read_json_lines(path, kLines);
  }
  static std::string key(const std::string& a, const std::string& b, const std::string& c) {
    return a + '\x1f' + b + '\x1f' + c;
  }
  static std::string run_line(const nlohmann::ordered_json& j) {
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  }
  eval::JsonLinesFile existing_;
  eval::LineAppender out_;
  std::map<std::string, eval::PlanRun> done_;
};

/// Scores `plans` on `items`, each item's missing runs measured (its reference first), the rest read from the
/// log. Returns one score per plan, the reference (recompute) first.
std::vector<eval::PlanScore> score_plans(eval::ReuseRunner& runner, RunLog& log, const std::string& split,
                                         const std::vector<eval::ReuseItem>& items,
                                         const std::vector<runtime::CrossModelPlan>& plans, int n_layers) {
  std::vector<eval::PlanScore> scores{to_score({}, n_layers)};
  for (const runtime::CrossModelPlan& p : plans) scores.push_back(to_score(p, n_layers));
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < items.size(); ++i) {
    const eval::ReuseItem& item = items[i];
    // An item with a plan missing from the log measures its reference again first: plans are scored against
    // the reference's logits, which the log does not keep.
    bool complete = log.find(split, item.id, "recompute");
    for (const runtime::CrossModelPlan& p : plans) complete = complete && log.find(split, item.id, p.describe());
    if (!complete) log.add(split, item.id, "recompute", runner.start(item));
    add_run(scores[0], *log.find(split, item.id, "recompute"));
    for (size_t k = 0; k < plans.size(); ++k) {
      const std::string name = plans[k].describe();
      if (!log.find(split, item.id, name)) log.add(split, item.id, name, runner.run(plans[k]));
      add_run(scores[k + 1], *log.find(split, item.id, name));
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "profile reuse: %s %zu/%zu (%s, %zu plans)  %.0f s%s\n", split.c_str(), i + 1, items.size(),
                 item.id.c_str(), plans.size() + 1, s, complete ? "  (from the log)" : "");
  }
  return scores;
}

std::vector<double> losses_of(eval::Quality q, const std::vector<eval::PlanScore>& scores) {
  std::vector<double> out;
  for (const eval::PlanScore& s : scores) out.push_back(eval::quality_loss(q, s, scores.front()));
  return out;
}

runtime::CrossModelPlan plan_of(const eval::PlanScore& s, int n_layers) {
  if (s.ranges.size() == 1 && s.ranges[0].begin == 0 && s.ranges[0].end == n_layers) return {};
  if (s.ranges.empty()) return {runtime::CrossModelPlan::Kind::Reuse, {}};
  return {runtime::CrossModelPlan::Kind::Partial, s.ranges};
}

nlohmann::ordered_json summary_json(const eval::PlanScore& s, const eval::PlanScore& reference, eval::Quality q) {
  return {{"n", s.n},
          {"loss", eval::quality_loss(q, s, reference)},
          {"token_f1", s.token_f1},
          {"kl", s.kl},
          {"metric", s.metric},
          {"metric_recompute", reference.metric},
          {"prefill_ms", s.prefill_ms},
          {"prefill_ms_recompute", reference.prefill_ms},
          {"speedup", s.prefill_ms > 0 ? reference.prefill_ms / s.prefill_ms : 0.0}};
}

void print_score(const char* label, const eval::PlanScore& s, const eval::PlanScore& ref, eval::Quality q,
                 int n_layers) {
  fmt::print("  {:<26} {:>7} {:>8.3f} {:>8.4f} {:>8.3f} {:>10.1f} {:>7.2f}x  {}\n", label,
             eval::recomputed_layers(s), s.token_f1, s.kl, s.metric, s.prefill_ms,
             s.prefill_ms > 0 ? ref.prefill_ms / s.prefill_ms : 0.0,
             fmt::format("{} (loss {:.4f})", eval::describe_plan(s.ranges, n_layers), eval::quality_loss(q, s, ref)));
}

void print_header() {
  fmt::print("  {:<26} {:>7} {:>8} {:>8} {:>8} {:>10} {:>8}  {}\n", "", "layers", "tok-F1", "KL", "metric",
             "TTFT ms", "speedup", "plan");
}

void run_reuse(const ReuseOptions& o) {
  const eval::Quality quality = eval::parse_quality(o.quality);
  if (o.receiver.empty()) throw InputError("--receiver is required", "name the model that reads: default or a GGUF");
  if (!(o.max_loss >= 0))
    throw InputError(fmt::format("--max-loss {}: a loss budget is a number >= 0", o.max_loss),
                     "0 keeps only plans as good as recompute; --quality says what the loss is");
  if (o.split < 1 || o.split > 99)
    throw InputError(fmt::format("--split {}: the training share must be 1 to 99 percent", o.split));
  const eval::Dataset data = eval::load_dataset(o.data_path);
  int sender = 0, receiver = 0;
  runtime::ModelOptions model_options = o.engine.model_options();
  model_options.add_models = [&](const model::Model& base, runtime::ModelSet& set, runtime::ExtraModels& extra) {
    sender = add_model(set, o.sender, o.sender_scale, "sender", base, extra.owned);
    receiver = add_model(set, o.receiver, o.receiver_scale, "receiver", base, extra.owned);
  };
  const std::shared_ptr<runtime::LoadedModels> loaded = runtime::load_models(model_options);
  const model::Model& base = loaded->model();
  const int n_layers = base.config().n_layers;
  runtime::ModelSet set = loaded->models();
  if (set[size_t(sender)].fingerprint == set[size_t(receiver)].fingerprint)
    throw InputError("the sender and the receiver are the same model: every plan would read its own KV",
                     "profile two different models (another adapter, scale or GGUF)");

  std::vector<eval::ReuseItem> items = eval::reuse_items(data, base, o.context_tokens);
  if (o.limit > 0 && int(items.size()) > o.limit) items.resize(size_t(o.limit));
  if (items.size() < 2) throw InputError("the reuse profiler needs at least 2 items (a training and a held-out split)");
  const size_t n_train = std::clamp<size_t>(size_t(std::lround(double(items.size()) * o.split / 100.0)), 1,
                                            items.size() - 1);
  const std::vector<eval::ReuseItem> train(items.begin(), items.begin() + std::ptrdiff_t(n_train));
  const std::vector<eval::ReuseItem> held_out(items.begin() + std::ptrdiff_t(n_train), items.end());

  std::vector<runtime::CrossModelPlan> plans{{runtime::CrossModelPlan::Kind::Reuse, {}}};
  for (runtime::CrossModelPlan& p : eval::sweep_plans(n_layers, o.step, o.max_span)) plans.push_back(std::move(p));
  if (o.critical)  // the single layers the critical-layer plan ranks
    for (int l = 0; l < n_layers; ++l)
      if (std::none_of(plans.begin(), plans.end(), [&](const runtime::CrossModelPlan& p) {
            return p.ranges.size() == 1 && p.ranges[0].begin == l && p.ranges[0].end == l + 1;
          }))
        plans.push_back(runtime::CrossModelPlan::partial(l, l + 1));
  // Every plan of the sweep reads the passages encoded once: the sender saves its hidden state at the first
  // layer of each plan's ranges (with --critical, every layer: the critical-layer plan's ranges start there).
  std::vector<int> e_layers;
  for (const runtime::CrossModelPlan& p : plans)
    for (const runtime::LayerRange& r : p.ranges) e_layers.push_back(r.begin);
  set.save_e_caches(sender, e_layers);

  std::filesystem::create_directories(o.out_dir);
  const nlohmann::ordered_json config = {
      {"model", base.file().path()},
      {"sender", {{"spec", o.sender}, {"scale", o.sender_scale}, {"fingerprint", hex(set[size_t(sender)].fingerprint)}}},
      {"receiver",
       {{"spec", o.receiver}, {"scale", o.receiver_scale}, {"fingerprint", hex(set[size_t(receiver)].fingerprint)}}},
      {"data", o.data_path},       {"items", items.size()},          {"train", n_train},
      {"max_tokens", o.max_tokens}, {"context_tokens", o.context_tokens}, {"kv", o.engine.type_k + "/" + o.engine.type_v}};
  RunLog log((std::filesystem::path(o.out_dir) / "runs.jsonl").string(), config, o.resume);
  if (log.n_resumed() > 0) std::fprintf(stderr, "profile reuse: resuming: %zu runs in the log\n", log.n_resumed());

  eval::ReuseRunner runner(set, sender, receiver, o.engine.engine_options(runtime::Mode::Choreo, StorePolicy::None),
                           data.metric, o.max_tokens);

  // The sweep, on the training split.
  std::vector<eval::PlanScore> scores = score_plans(runner, log, "train", train, plans, n_layers);
  const std::vector<double> losses = losses_of(quality, scores);
  const std::optional<size_t> chosen = eval::choose_plan(scores, losses, o.max_loss);
  const std::vector<size_t> frontier = eval::pareto_frontier(scores, losses);
  const runtime::CrossModelPlan chosen_plan = plan_of(scores[chosen.value_or(0)], n_layers);

  // Fig. 11: the chosen number of layers, as the individually most useful ones instead of one range.
  std::optional<runtime::CrossModelPlan> scattered;
  if (o.critical && chosen_plan.kind == runtime::CrossModelPlan::Kind::Partial && chosen_plan.ranges.size() == 1) {
    std::vector<double> single(size_t(n_layers), NAN);
    for (size_t i = 0; i < scores.size(); ++i)
      if (scores[i].ranges.size() == 1 && scores[i].ranges[0].end == scores[i].ranges[0].begin + 1)
        single[size_t(scores[i].ranges[0].begin)] = losses[i];
    scattered = eval::critical_layers_plan(single, chosen_plan.recomputed_layers(n_layers));
  }
  std::vector<eval::PlanScore> scattered_train;
  if (scattered) scattered_train = score_plans(runner, log, "train", train, {*scattered}, n_layers);

  // The chosen plan on the held-out split, beside reuse (and the critical layers).
  std::vector<runtime::CrossModelPlan> check;
  if (chosen_plan.kind != runtime::CrossModelPlan::Kind::Recompute) check.push_back(chosen_plan);
  if (chosen_plan.kind != runtime::CrossModelPlan::Kind::Reuse) check.push_back({runtime::CrossModelPlan::Kind::Reuse, {}});
  if (scattered) check.push_back(*scattered);
  const std::vector<eval::PlanScore> held = score_plans(runner, log, "held_out", held_out, check, n_layers);
  const eval::PlanScore& held_chosen = chosen_plan.kind == runtime::CrossModelPlan::Kind::Recompute ? held[0] : held[1];

  // Files: every plan's scores, the heatmap, the frontier, the plan file.
  const std::filesystem::path dir = o.out_dir;
  const auto short_name = [](const std::string& spec) { return std::filesystem::path(spec).filename().string(); };
  const std::string title = fmt::format("{} reading {}: {} loss, {} training items", short_name(o.receiver),
                                        short_name(o.sender), eval::quality_name(quality), n_train);
  write_file_atomically((dir / "plans.json").string(), eval::plans_json(scores, losses, n_layers).dump(2) + "\n");
  write_file_atomically((dir / "heatmap.svg").string(),
                        eval::heatmap_svg(scores, losses, n_layers, quality, chosen, title));
  write_file_atomically((dir / "frontier.svg").string(),
                        eval::frontier_svg(scores, losses, frontier, n_layers, quality, chosen, title));
  std::vector<eval::PlanScore> front;
  std::vector<double> front_losses;
  for (size_t i : frontier) {
    front.push_back(scores[i]);
    front_losses.push_back(losses[i]);
  }
  write_file_atomically((dir / "frontier.json").string(), eval::plans_json(front, front_losses, n_layers).dump(2) + "\n");
  nlohmann::ordered_json plan_file = exec::reuse_plan_json(config["sender"], config["receiver"], n_layers, chosen_plan);
  plan_file.update(nlohmann::ordered_json{
      {"quality", eval::quality_name(quality)},
      {"max_loss", o.max_loss},
      {"train", summary_json(scores[chosen.value_or(0)], scores[0], quality)},
      {"held_out", summary_json(held_chosen, held[0], quality)}});
  if (scattered) {
    plan_file["critical_layers"] = {{"plan", scattered->describe()},
                                    {"train", summary_json(scattered_train[1], scattered_train[0], quality)},
                                    {"held_out", summary_json(held.back(), held[0], quality)}};
  }
  write_file_atomically((dir / "plan.json").string(), plan_file.dump(2) + "\n");

  // The report.
  fmt::print("reuse plans for {} reading {} ({} layers), {} training and {} held-out items of {}\n", o.receiver,
             o.sender, n_layers, train.size(), held_out.size(), o.data_path);
  fmt::print("quality: {} loss against recompute; chosen: the cheapest plan within {}\n\n", eval::quality_name(quality),
             o.max_loss);
  fmt::print("Pareto frontier (training split):\n");
  print_header();
  for (size_t i : frontier) print_score(i == chosen ? "* chosen" : "", scores[i], scores[0], quality, n_layers);
  if (scattered) {
    fmt::print("\ncritical layers (the {} best single layers, training split):\n",
               chosen_plan.recomputed_layers(n_layers));
    print_header();
    print_score("one range (chosen)", scores[*chosen], scores[0], quality, n_layers);
    print_score("critical layers", scattered_train[1], scattered_train[0], quality, n_layers);
  }
  fmt::print("\nheld-out split:\n");
  print_header();
  print_score("recompute", held[0], held[0], quality, n_layers);
  for (size_t i = 1; i < held.size(); ++i)
    print_score(i == 1 && chosen_plan.kind != runtime::CrossModelPlan::Kind::Recompute ? "chosen" : "", held[i], held[0],
                quality, n_layers);
  fmt::print("\nwrote {0}/plan.json, {0}/plans.json, {0}/frontier.json, {0}/heatmap.svg, {0}/frontier.svg\n",
             o.out_dir);
}

}  // namespace

void register_profile_reuse(CLI::App& profile) {
  auto o = std::make_shared<ReuseOptions>();
  CLI::App* cmd = profile.add_subcommand(
      "reuse", "sweep cross-model reuse plans (DroidSpeak) for a sender and a receiver model on a dataset");
  cmd->add_option("--sender", o->sender,
                  "the model that encodes the passages: default (-m with --lora), an adapter GGUF over -m, or "
                  "another GGUF of -m's architecture (default: default)");
  cmd->add_option("--receiver", o->receiver, "the model that answers, reading them (as for --sender)")->required();
  cmd->add_option("--sender-scale", o->sender_scale, "the sender adapter's scale (default 1)");
  cmd->add_option("--receiver-scale", o->receiver_scale, "the receiver adapter's scale (default 1)");
  cmd->add_option("--data", o->data_path, "the dataset: MuSiQue or LongBench rows (context and question)")
      ->required();
  cmd->add_option("-o,--out", o->out_dir, "directory for runs.jsonl, plans.json, plan.json and the SVGs")
      ->required();
  cmd->add_option("--split", o->split, "percent of the items that form the training split (default 50)");
  cmd->add_option("--limit", o->limit, "items to use from --data (default 20; 0 = all)")->check(at_least(0));
  cmd->add_option("--step", o->step, "the sweep's layer grid: plans [s, e) with s and e multiples of it (default 1)")
      ->check(at_least(1));
  cmd->add_option("--max-span", o->max_span, "sweep only plans recomputing at most this many layers (0 = any)")
      ->check(at_least(0));
  cmd->add_option("--max-tokens", o->max_tokens, "tokens of each greedy answer (default 16)")->check(at_least(1));
  cmd->add_option("--context-tokens", o->context_tokens,
                  "passage tokens per item: the first N (default 1024; 0 = all)")
      ->check(at_least(0));
  cmd->add_option("--quality", o->quality, "what a plan's loss is: f1 (1 - token-F1 against recompute's answers; "
                                           "default), kl (mean KL, nats) or metric (drop of the dataset's metric)");
  cmd->add_option("--max-loss", o->max_loss, "choose the cheapest plan whose loss is at most this (default 0.05)");
  cmd->add_flag("--critical", o->critical,
                "also score the chosen number of layers as the individually best single layers (DroidSpeak Fig. 11)");
  cmd->add_flag("--resume", o->resume, "continue the profile whose runs.jsonl is in -o");
  o->engine.add(*cmd, EngineFlags::kModel | EngineFlags::kLora | EngineFlags::kKv | EngineFlags::kCache);
  cmd->callback([o] { run_reuse(*o); });
}

}  // namespace choreo::cli
