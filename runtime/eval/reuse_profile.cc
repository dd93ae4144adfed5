#include "runtime/eval/reuse_profile.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "common/error.h"
#include "runtime/model/chat_template.h"

namespace choreo::eval {

namespace {

std::vector<model::Token> join(std::vector<model::Token> a, const std::vector<model::Token>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

const std::string* field(const Row& row, std::initializer_list<const char*> names) {
  for (const char* name : names)
    if (const auto it = row.fields.find(name); it != row.fields.end()) return &it->second;
  return nullptr;
}

}  // namespace

std::vector<ReuseItem> reuse_items(const Dataset& data, const model::Model& model, int max_context_tokens) {
  const model::Vocab& vocab = model.vocab();
  const model::ChatFormat f = model.chat_format();
  const auto special = [&](const std::string& text) { return vocab.tokenize(text, false, true); };
  const model::TurnAffixes passages = model::turn_affixes_after(f, "user", "");
  const model::TurnAffixes question = model::turn_affixes_after(f, "user", "user");
  const model::TurnAffixes answer = model::turn_affixes_after(f, "assistant", "user");
  std::vector<ReuseItem> items;
  for (const Row& row : data.rows) {
    const std::string* context = field(row, {"context"});
    const std::string* ask = field(row, {"question", "input"});
    if (!context || !ask)
      throw InputError(fmt::format("{}:{}: row {} has no {}", data.path, row.line, row.id, context ? "question" : "context"),
                       "the reuse profiler reads passages (`context`) and a question (`question` or `input`): "
                       "MuSiQue or LongBench rows");
    ReuseItem item{row.id, row.line, {}, {}, {row.gold, row.all_classes, row.dataset}};
    std::vector<model::Token> body = vocab.tokenize(model::format_content(f, *context), false, false);
    if (max_context_tokens > 0 && int(body.size()) > max_context_tokens) body.resize(size_t(max_context_tokens));
    item.context = join(join(special(passages.prefix), body), special(passages.suffix));
    const std::string ask_text =
        fmt::format("Answer the question with a short phrase, using the passages.\nQuestion: {}", *ask);
    item.header = f == model::ChatFormat::None
                      ? vocab.tokenize("\n" + ask_text + "\nAnswer:", false, false)
                      : special(question.prefix + model::format_content(f, ask_text) + question.suffix + answer.prefix);
    items.push_back(std::move(item));
  }
  return items;
}

ReuseRunner::ReuseRunner(runtime::ModelSet models, int sender, int receiver, runtime::EngineOptions engine,
                         std::optional<Metric> metric, int max_tokens)
    : models_(std::move(models)), sender_(sender), receiver_(receiver), options_(std::move(engine)),
      metric_(metric), max_tokens_(max_tokens) {
  options_.mode = runtime::Mode::Choreo;
}

const PlanRun& ReuseRunner::start(const ReuseItem& item) {
  engine_ = nullptr;
  opened_.reset();  // the previous item's pages go back to the backend first
  opened_ = runtime::open_engine(models_, options_);
  engine_ = &opened_->engine();
  item_ = &item;
  runtime::PrefillRequest passages;
  passages.tokens = item.context;
  passages.model = sender_;
  context_ = engine_->prefill(passages).id;
  engine_->set_plan(sender_, receiver_, {});
  runtime::DecodeRequest r = answer_request();
  r.record_logits = true;
  reference_ = engine_->decode(r);
  engine_->release(reference_.id);
  reference_run_ = {reference_.text, 1.0, 0.0, 0.0, reference_.stats.ttft_ms, 0};
  if (metric_) reference_run_.metric = score_sample(*metric_, reference_.text, item.gold).score;
  return reference_run_;
}

runtime::DecodeRequest ReuseRunner::answer_request() const {
  runtime::DecodeRequest r;
  r.header = item_->header;
  r.parents = {{context_}};
  r.max_tokens = max_tokens_;
  r.sampling.temperature = 0;
  r.model = receiver_;
  return r;
}

PlanRun ReuseRunner::run(const runtime::CrossModelPlan& plan) {
  engine_->set_plan(sender_, receiver_, plan);
  const runtime::DecodeRequest greedy = answer_request();
  const runtime::DecodeResult answer = engine_->decode(greedy);
  engine_->release(answer.id);
  // Teacher-forced on recompute's answer: the plan's next-token distributions where recompute's were taken.
  runtime::DecodeRequest forced = greedy;
  forced.forced = reference_.generated;
  forced.record_logits = true;
  const runtime::DecodeResult followed = engine_->decode(forced);
  engine_->release(followed.id);
  PlanRun out;
  out.text = answer.text;
  out.ttft_ms = answer.stats.ttft_ms;
  out.n_e_recomputed = answer.stats.n_e_recomputed;
  out.kl = mean_kl(reference_.logits, followed.logits);
  out.token_f1 = answer.text == reference_.text
                     ? 1.0
                     : score_sample(Metric::qa_f1, answer.text, {{reference_.text}, {}, {}}).score;
  if (metric_) out.metric = score_sample(*metric_, answer.text, item_->gold).score;
  return out;
}

std::vector<runtime::CrossModelPlan> sweep_plans(int n_layers, int step, int max_span) {
  std::vector<int> bounds;
  for (int l = 0; l < n_layers; l += std::max(step, 1)) bounds.push_back(l);
  bounds.push_back(n_layers);
  std::vector<runtime::CrossModelPlan> plans;
  for (size_t i = 0; i < bounds.size(); ++i)
    for (size_t j = i + 1; j < bounds.size(); ++j) {
      const int s = bounds[i], e = bounds[j];
      if ((max_span > 0 && e - s > max_span) || (s == 0 && e == n_layers)) continue;
      plans.push_back(runtime::CrossModelPlan::partial(s, e));
    }
  return plans;
}

runtime::CrossModelPlan critical_layers_plan(const std::vector<double>& single_loss, int k) {
  std::vector<int> layers;
  for (int l = 0; l < int(single_loss.size()); ++l)
    if (!std::isnan(single_loss[size_t(l)])) layers.push_back(l);
  std::stable_sort(layers.begin(), layers.end(),
                   [&](int a, int b) { return single_loss[size_t(a)] < single_loss[size_t(b)]; });
  layers.resize(std::min(layers.size(), size_t(std::max(k, 0))));
  std::sort(layers.begin(), layers.end());
  runtime::CrossModelPlan plan{runtime::CrossModelPlan::Kind::Partial, {}};
  for (int l : layers) {
    if (!plan.ranges.empty() && plan.ranges.back().end == l)
      ++plan.ranges.back().end;
    else
      plan.ranges.push_back({l, l + 1});
  }
  return plan;
}

}  // namespace choreo::eval
