#include "runtime/serve/choreo_decoder.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <unordered_map>

#include "common/error.h"
#include "runtime/model/chat_template.h"
#include "runtime/serve/text_stream.h"

namespace choreo::serve {

namespace {

ApiError out_of_room() {
  return ApiError(503, "server_error", "kv_budget_exhausted",
                  "the server's KV cache budget is spent by requests in flight; retry later");
}

ApiError not_found(const ChoreoItem& item) {
  return ApiError(
      404, "invalid_request_error", "message_not_found",
      fmt::format("no message is named '{}' (it was never named, or the server restarted or forgot the "
                  "name); send the message's text with \"choreo\": {{\"id\": \"{}\"}} instead",
                  item.id, item.id),
      item.param + ".id");
}

ApiError conflict(const std::string& id, const std::string& param, const std::string& why) {
  return ApiError(409, "invalid_request_error", "id_conflict",
                  fmt::format("the id '{}' already names {}; give this message another id", id, why), param);
}

ApiError cycle(const std::string& param, const std::string& why) {
  return ApiError(400, "invalid_request_error", "item_reference_cycle",
                  fmt::format("{}: a message cannot be its own parent", why), param);
}

}  // namespace

/// One entry of a request's prompt, resolved.
struct ChoreoDecoder::Slot {
  kv::MessageId message = kv::kNoMessage;  // known before the group ran
  int made_by = -1;                        // else: the group's new message that makes it
  std::string role, closing;
  int n_tokens = 0;
  int position = 0;  // where the request places it
  const ChoreoItem* item = nullptr;
};

/// A message the group prefills.
struct ChoreoDecoder::NewMessage {
  size_t plan = 0;
  size_t slot = 0;  // the slot of its plan that defines it
  std::vector<model::Token> tokens;
  int wave = 1;  // its prefill batch: after those of the new messages before it
  std::string name, role;
  uint64_t text_hash = 0;
  runtime::PrefillResult result;
};

/// One request of the group.
struct ChoreoDecoder::Plan {
  std::shared_ptr<ExtensionGeneration> g;
  std::vector<Slot> slots;
  std::vector<model::Token> header;
  std::string answer_name;
  int max_tokens = 0;
  bool done = false;  // finished, failed or deferred
  std::optional<TextStream> text;
  double ttft_ms = -1;
  runtime::DecodeResult result;
  void fail(std::exception_ptr e) {
    if (done) return;
    done = true;
    g->fail(std::move(e));
  }
};

struct ChoreoDecoder::Group {
  std::vector<Plan> plans;
  std::vector<NewMessage> made;
  // Names the group's requests give: to a new message (its index in `made`), or to an answer (-1).
  std::unordered_map<std::string, int> pending;
  kv::MessageId message_of(const Slot& s) const {
    return s.made_by < 0 ? s.message : made[size_t(s.made_by)].result.id;
  }
};

ChoreoDecoder::ChoreoDecoder(runtime::Engine& engine, PinLimits pins, size_t max_names)
    : engine_(engine), hints_(pins), names_(max_names) {
  engine_.step_oracles().add(&hints_);
}

ChoreoDecoder::~ChoreoDecoder() { engine_.step_oracles().remove(&hints_); }

uint64_t ChoreoDecoder::text_hash(const std::string& role, const std::string& text) {
  const std::string both = role + '\0' + text;
  return XXH3_64bits(both.data(), both.size());
}

ChoreoDecoder::Slot ChoreoDecoder::existing(const NamedMessage& named) const {
  Slot s;
  s.message = named.message;
  s.role = named.role;
  s.closing = named.closing;
  s.n_tokens = int(engine_.store().record(named.message).tokens.size());
  return s;
}

std::vector<model::Token> ChoreoDecoder::turn_tokens(const Plan& plan, const std::string& role,
                                                     const std::optional<std::string>& text) const {
  const model::Model& weights = *engine_.models()[size_t(plan.g->request().model)].weights;
  const model::ChatFormat format = weights.chat_format();
  if (format == model::ChatFormat::None)
    throw ApiError(400, "invalid_request_error", "no_chat_template",
                   "choreo's extensions need a model with a chat template choreo knows");
  // As `choreo exec` tokenizes a role call: the previous turn's closing alone, then this turn (a decode's
  // header is its turn's prefix only: the model writes the rest).
  const Slot* previous = plan.slots.empty() ? nullptr : &plan.slots.back();
  std::vector<model::Token> tokens;
  if (previous && !previous->closing.empty())
    tokens = weights.vocab().tokenize(previous->closing, false, true);
  const model::TurnAffixes turn = model::turn_affixes_after(format, role, previous ? previous->role : "");
  const std::string whole =
      text ? turn.prefix + model::format_content(format, *text) + turn.suffix : turn.prefix;
  const std::vector<model::Token> own = weights.vocab().tokenize(whole, false, true);
  tokens.insert(tokens.end(), own.begin(), own.end());
  return tokens;
}

void ChoreoDecoder::resolve(Group& group, Plan& plan) {
  const ExtensionRequest& r = plan.g->request();
  const ChoreoRequest& ext = r.ext;
  const size_t plan_index = size_t(&plan - group.plans.data());
  const size_t made_base = group.made.size();
  std::vector<std::string> named_here;
  try {
    // Ids this request gives its messages, first place each.
    std::unordered_map<std::string, size_t> defines;
    for (size_t k = 0; k < ext.items.size(); ++k)
      if (!ext.items[k].reference && !ext.items[k].id.empty()) defines.emplace(ext.items[k].id, k);
    if (ext.output_id.empty()) throw std::invalid_argument("ChoreoDecoder: a request without an output id");
    for (const ChoreoItem& item : ext.items)
      if (item.id == ext.output_id)
        throw cycle("choreo.output_id", fmt::format("the answer's id '{}' is also {} of this request", ext.output_id,
                                                    item.reference ? "an item_reference" : "a message's id"));
    if (names_.find(ext.output_id) || group.pending.count(ext.output_id))
      throw conflict(ext.output_id, "choreo.output_id", "another message (output ids name new answers)");
    plan.answer_name = ext.output_id;
    int position = engine_.first_pos();
    for (size_t k = 0; k < ext.items.size(); ++k) {
      const ChoreoItem& item = ext.items[k];
      Slot s;
      std::optional<uint64_t> hash;
      if (!item.reference) hash = text_hash(item.role, item.text);
      const NamedMessage* known = item.id.empty() ? nullptr : names_.use(item.id);
      const auto pending = item.id.empty() ? group.pending.end() : group.pending.find(item.id);
      if (known) {
        if (hash && *hash != known->text_hash)
          throw conflict(item.id, item.param + ".choreo.id", "another text");
        s = existing(*known);
      } else if (pending != group.pending.end()) {
        if (pending->second < 0) {
          if (item.reference) throw Defer{};  // an answer another request of the group is generating
          throw conflict(item.id, item.param + ".choreo.id", "the answer of a request in flight");
        }
        const NewMessage& m = group.made[size_t(pending->second)];
        if (hash && *hash != m.text_hash) throw conflict(item.id, item.param + ".choreo.id", "another text");
        s.made_by = pending->second;
        s.role = m.role;
        s.n_tokens = int(m.tokens.size());
      } else if (item.reference) {
        if (defines.count(item.id))
          throw cycle(item.param, fmt::format("'{}' refers to '{}', which {} of this request defines over it",
                                              item.param, item.id, ext.items[defines.at(item.id)].param));
        throw not_found(item);
      } else {
        NewMessage m;
        m.plan = plan_index;
        m.slot = k;
        m.tokens = turn_tokens(plan, item.role, item.text);
        if (m.tokens.empty())
          throw ApiError(400, "invalid_request_error", "invalid_value", "the message has no tokens",
                         item.param);
        for (const Slot& before : plan.slots)
          if (before.made_by >= 0) m.wave = std::max(m.wave, group.made[size_t(before.made_by)].wave + 1);
        m.name = item.id;
        m.role = item.role;
        m.text_hash = *hash;
        s.made_by = int(group.made.size());
        s.role = item.role;
        s.n_tokens = int(m.tokens.size());
        group.made.push_back(std::move(m));
        if (!item.id.empty()) {
          group.pending.emplace(item.id, s.made_by);
          named_here.push_back(item.id);
        }
      }
      s.position = position;
      s.item = &item;
      position += s.n_tokens;
      plan.slots.push_back(std::move(s));
    }
    plan.header = turn_tokens(plan, "assistant", std::nullopt);
    const int n_ctx = engine_.models()[size_t(r.model)].weights->config().n_ctx_train;
    const int end = position + int(plan.header.size());
    if (end >= n_ctx)
      throw ApiError(400, "invalid_request_error", "context_length_exceeded",
                     fmt::format("the prompt ends at position {}; the model's context is {}", end, n_ctx),
                     "messages");
    plan.max_tokens = r.max_tokens > 0 ? std::min(r.max_tokens, n_ctx - end) : n_ctx - end;
    group.pending.emplace(plan.answer_name, -1);
    named_here.push_back(plan.answer_name);
  } catch (...) {
    group.made.resize(made_base);
    for (const std::string& name : named_here) group.pending.erase(name);
    plan.slots.clear();
    throw;
  }
}

std::vector<runtime::Parent> ChoreoDecoder::parents_of(const Group& group, const Plan& plan, size_t n) {
  std::vector<runtime::Parent> parents;
  for (size_t k = 0; k < n; ++k)
    parents.push_back({group.message_of(plan.slots[k]), std::nullopt, std::nullopt});
  return parents;
}

void ChoreoDecoder::prefill_waves(Group& group) {
  int last_wave = 0;
  for (const NewMessage& m : group.made) last_wave = std::max(last_wave, m.wave);
  for (int wave = 1; wave <= last_wave; ++wave) {
    std::vector<size_t> which;
    std::vector<runtime::PrefillRequest> requests;
    for (size_t i = 0; i < group.made.size(); ++i) {
      NewMessage& m = group.made[i];
      Plan& plan = group.plans[m.plan];
      if (m.wave != wave || plan.done) continue;
      // A message before it that another request was to make, and could not, fails this request too.
      if (std::any_of(plan.slots.begin(), plan.slots.begin() + ptrdiff_t(m.slot),
                      [&](const Slot& s) { return group.message_of(s) == kv::kNoMessage; })) {
        plan.fail(std::make_exception_ptr(out_of_room()));
        continue;
      }
      runtime::PrefillRequest r;
      r.tokens = m.tokens;
      r.parents = parents_of(group, plan, m.slot);
      r.agent = plan.g->request().agent;
      r.model = plan.g->request().model;
      which.push_back(i);
      requests.push_back(std::move(r));
    }
    if (requests.empty()) continue;
    std::vector<runtime::PrefillResult> results;
    try {
      results = engine_.prefill_batch(requests);
    } catch (const InputError&) {
      for (size_t i : which) group.plans[group.made[i].plan].fail(std::make_exception_ptr(out_of_room()));
      continue;
    }
    ++stats_.prefill_batches;
    stats_.prefills += requests.size();
    for (size_t k = 0; k < which.size(); ++k) {
      NewMessage& m = group.made[which[k]];
      m.result = results[k];
      if (!m.name.empty()) names_.put(m.name, {m.result.id, m.text_hash, m.role, ""});
    }
  }
}

PromptUsage ChoreoDecoder::usage_of(const Group& group, const Plan& plan) const {
  const size_t plan_index = size_t(&plan - group.plans.data());
  PromptUsage u;
  const auto add_loads = [&u](const runtime::CallStats& stats) {
    u.loaded_t1 += stats.n_loaded_from[1];
    u.loaded_t2 += stats.n_loaded_from[2];
    u.loaded_t3 += stats.n_loaded_from[3];
    u.recomputed += stats.n_recomputed;
  };
  // The entries up to the first one not encoded where it now sits, over exactly the entries before it, are a
  // prefix hit; later reused entries are reused out of prefix (read through virtual repositioning).
  bool in_prefix = true;
  for (size_t k = 0; k < plan.slots.size(); ++k) {
    const Slot& s = plan.slots[k];
    const kv::MessageId id = group.message_of(s);
    const NewMessage* m = s.made_by >= 0 ? &group.made[size_t(s.made_by)] : nullptr;
    const bool made_here = m && m->plan == plan_index && m->slot == k;
    int computed = 0;
    if (made_here) {
      computed = m->result.stats.n_computed;
      add_loads(m->result.stats);
    }
    const kv::Message& record = engine_.store().record(id);
    bool in_place = record.start_pos == s.position && record.model == plan.g->request().model &&
                    record.parents.size() == k;
    for (size_t j = 0; in_place && j < k; ++j)
      in_place = record.parents[j].message == group.message_of(plan.slots[j]) &&
                 record.parents[j].offset == plan.slots[j].position;
    in_prefix = in_prefix && in_place;
    (in_prefix ? u.prefix_reused : u.reused_out_of_prefix) += s.n_tokens - computed;
    u.computed += computed;
    u.prompt_tokens += s.n_tokens;
  }
  u.prompt_tokens += int(plan.header.size());
  u.computed += int(plan.header.size());
  if (plan.result.id != kv::kNoMessage) add_loads(plan.result.stats);
  return u;
}

void ChoreoDecoder::apply_hints(const Group& group, const Plan& plan, GenerationResult& out) {
  const kv::PagePool& pool = engine_.store().pool();
  const auto bytes_of = [&](kv::MessageId id) {
    return pool.layout().pages_for(engine_.store().record(id).tokens.size()) * pool.page_bytes();
  };
  std::vector<kv::MessageId> read;
  for (const Slot& s : plan.slots) {
    const kv::MessageId id = group.message_of(s);
    read.push_back(id);
    hints_.hit(id);
    if (s.item->retention && !hints_.retain(id, *s.item->retention, bytes_of(id)))
      out.pins_refused.push_back(s.item->id.empty() ? s.item->param : s.item->id);
  }
  read.push_back(plan.result.id);
  const ChoreoRequest& ext = plan.g->request().ext;
  if (ext.retention && !hints_.retain(plan.result.id, *ext.retention, bytes_of(plan.result.id)))
    out.pins_refused.push_back(plan.answer_name);
  hints_.step(ext, read);
}

void ChoreoDecoder::decode_all(Group& group) {
  std::vector<Plan*> which;
  std::vector<runtime::DecodeRequest> requests;
  for (Plan& plan : group.plans) {
    if (plan.done) continue;
    if (std::any_of(plan.slots.begin(), plan.slots.end(),
                    [&](const Slot& s) { return group.message_of(s) == kv::kNoMessage; })) {
      plan.fail(std::make_exception_ptr(out_of_room()));
      continue;
    }
    const ExtensionRequest& r = plan.g->request();
    const model::Vocab& vocab = engine_.models()[size_t(r.model)].weights->vocab();
    runtime::DecodeRequest d;
    d.header = plan.header;
    d.parents = parents_of(group, plan, plan.slots.size());
    d.sampling = r.sampling;
    d.max_tokens = plan.max_tokens;
    if (r.ignore_eos) d.exact_tokens = plan.max_tokens;
    d.stop = r.stop;
    d.agent = r.agent;
    d.model = r.model;
    d.on_token = [&plan, &vocab](model::Token t) {
      if (plan.ttft_ms < 0) plan.ttft_ms = plan.g->ms_since_created();
      if (std::string shown = plan.text->append(vocab.token_to_piece(t)); !shown.empty())
        plan.g->emit(0, std::move(shown));
    };
    d.cancelled = [g = plan.g] { return g->cancelled(); };
    plan.g->admitted(usage_of(group, plan));
    which.push_back(&plan);
    requests.push_back(std::move(d));
  }
  if (requests.empty()) return;
  std::vector<runtime::DecodeResult> results;
  try {
    results = engine_.decode_batch(requests);
  } catch (const InputError&) {
    for (Plan* plan : which) plan->fail(std::make_exception_ptr(out_of_room()));
    return;
  }
  ++stats_.decode_batches;
  stats_.decodes += requests.size();
  for (size_t k = 0; k < which.size(); ++k) finish(group, *which[k], std::move(results[k]), requests[k]);
}

void ChoreoDecoder::finish(Group& group, Plan& plan, runtime::DecodeResult result,
                           const runtime::DecodeRequest& request) {
  const ExtensionRequest& r = plan.g->request();
  const model::Model& weights = *engine_.models()[size_t(r.model)].weights;
  const model::Vocab& vocab = weights.vocab();
  plan.result = std::move(result);
  const std::vector<model::Token>& generated = plan.result.generated;
  const bool ended_on_eog = !generated.empty() && vocab.is_eog(generated.back());
  GenerationResult out;
  Choice& c = out.choices.emplace_back();
  c.text = plan.text->text();
  if (std::string rest = plan.text->finish(c.text); !rest.empty()) plan.g->emit(0, std::move(rest));
  c.stop_string = plan.text->stop_string();
  c.finish_reason = plan.result.stop_reason == "length" || plan.result.stop_reason == "cancelled"
                        ? plan.result.stop_reason
                        : "stop";
  c.n_generated = int(generated.size()) - (ended_on_eog && !request.exact_tokens ? 1 : 0);
  c.message = plan.result.id;
  out.completion_tokens = c.n_generated;
  // The answer is a message later requests can name, and continue as a chat turn (exec's turn closing).
  const std::string previous_role = plan.slots.empty() ? "" : plan.slots.back().role;
  const std::string closing = model::unfinished_suffix(
      model::turn_affixes_after(weights.chat_format(), "assistant", previous_role).suffix,
      ended_on_eog ? vocab.token_to_piece(generated.back(), true) : "");
  names_.put(plan.answer_name, {plan.result.id, text_hash("assistant", c.text), "assistant", closing});
  out.message_id = plan.answer_name;
  out.usage = usage_of(group, plan);
  apply_hints(group, plan, out);
  out.ttft_ms = plan.ttft_ms < 0 ? plan.g->ms_since_created() : plan.ttft_ms;
  out.total_ms = plan.g->ms_since_created();
  plan.done = true;
  plan.g->finish(std::move(out));
}

std::vector<std::shared_ptr<ExtensionGeneration>> ChoreoDecoder::run(
    std::vector<std::shared_ptr<ExtensionGeneration>> arrived) {
  Group group;
  group.plans.reserve(arrived.size());  // plans point into it
  std::vector<std::shared_ptr<ExtensionGeneration>> deferred;
  for (std::shared_ptr<ExtensionGeneration>& g : arrived) {
    Plan& plan = group.plans.emplace_back();
    plan.text.emplace(g->request().stop);
    plan.g = std::move(g);
  }
  size_t tokens = 0;
  for (Plan& plan : group.plans) {
    try {
      resolve(group, plan);
      tokens += size_t(plan.max_tokens) + plan.header.size();
    } catch (const Defer&) {
      plan.done = true;
      deferred.push_back(plan.g);
      ++stats_.deferred;
    } catch (...) {
      plan.fail(std::current_exception());
    }
  }
  for (const NewMessage& m : group.made) tokens += m.tokens.size();
  ++stats_.groups;
  try {
    const kv::PagePool& pool = engine_.store().pool();
    if (make_room_) make_room_(pool.layout().pages_for(tokens) * pool.page_bytes());
    prefill_waves(group);
    decode_all(group);
  } catch (...) {
    for (Plan& plan : group.plans) plan.fail(std::current_exception());
  }
  return deferred;
}

}  // namespace choreo::serve
