#include "runtime/serve/plain_decoder.h"

#include <algorithm>
#include <limits>
#include <map>

#include <fmt/format.h>

#include "common/error.h"

namespace choreo::serve {

namespace {

ApiError out_of_room() {
  return ApiError(503, "server_error", "kv_budget_exhausted",
                  "the server's KV cache budget is spent by requests in flight; retry later",
                  "");
}

}  // namespace

/// A generation whose choices are still decoding.
struct PlainDecoder::Open {
  std::shared_ptr<PlainGeneration> g;
  GenerationResult result;
  int max_tokens = 0;
  int remaining = 0;  // choices still decoding
};

void PlainDecoder::admit(const std::shared_ptr<PlainGeneration>& g) {
  const PlainRequest& r = g->request();
  std::optional<size_t> first_slot;
  try {
    if (r.model < 0 || size_t(r.model) >= models_.size()) throw std::out_of_range("PlainDecoder: no such model");
    const int n_ctx = models_[size_t(r.model)].weights->config().n_ctx_train;
    const int n_prompt = int(r.prompt.size());
    if (n_prompt == 0) throw ApiError(400, "invalid_request_error", "empty_prompt", "the prompt is empty");
    if (n_prompt >= n_ctx)
      throw ApiError(400, "invalid_request_error", "context_length_exceeded",
                     fmt::format("the prompt has {} tokens; the model's context is {}", n_prompt, n_ctx), "messages");
    auto open = std::make_shared<Open>();
    open->g = g;
    open->max_tokens = r.max_tokens > 0 ? std::min(r.max_tokens, n_ctx - n_prompt) : n_ctx - n_prompt;
    open->result.choices.resize(size_t(r.n));
    open->result.usage.prompt_tokens = n_prompt;

    int reused = 0;
    const size_t slot = cache_.acquire(r.model, r.prompt, &reused);
    first_slot = slot;
    model::Session& session = cache_.session(slot);
    cache_.make_room(cache_.bytes_to_grow(slot, n_prompt - reused));
    std::vector<float> logits;
    try {
      session.eval(std::span(r.prompt).subspan(size_t(reused)), &logits);
    } catch (const InputError&) {
      throw out_of_room();  // the context was checked above: what is left is the pool's budget
    }
    open->result.usage.prefix_reused = reused;
    open->result.usage.computed = n_prompt - reused;
    stats_.prompt_reused += uint64_t(reused);
    stats_.prompt_computed += uint64_t(n_prompt - reused);

    g->admitted(open->result.usage);
    std::vector<size_t> slots{slot};
    for (int i = 1; i < r.n; ++i) slots.push_back(cache_.acquire_copy(slot));
    first_slot.reset();  // owned by the choices from here on
    open->remaining = r.n;
    for (int i = 0; i < r.n; ++i) {
      model::SamplingParams sp = r.sampling;
      sp.seed += uint64_t(i);
      Decoding c{open, size_t(i), slots[size_t(i)], model::Sampler(sp), TextStream(r.stop), 0, 0};
      if (advance(c, logits)) choices_.push_back(std::move(c));
    }
    open->result.ttft_ms = g->ms_since_created();
  } catch (...) {
    if (first_slot) {
      cache_.session(*first_slot).reset();
      cache_.release(*first_slot);
    }
    g->fail(std::current_exception());
  }
}

bool PlainDecoder::advance(Decoding& c, std::span<const float> logits) {
  PlainGeneration& g = *c.open->g;
  if (g.cancelled()) {
    end(c, "cancelled");
    return false;
  }
  const model::Vocab& vocab = models_[size_t(g.request().model)].weights->vocab();
  if (g.request().ignore_eos) {
    masked_.assign(logits.begin(), logits.end());
    for (size_t id = 0; id < masked_.size(); ++id)
      if (vocab.is_eog(model::Token(id))) masked_[id] = -std::numeric_limits<float>::infinity();
    logits = masked_;
  }
  const model::Token t = c.sampler.sample(logits);
  if (vocab.is_eog(t)) {
    end(c, "stop");
    return false;
  }
  ++c.n_generated;
  ++stats_.generated;
  std::string shown = c.text.append(vocab.token_to_piece(t));
  if (!shown.empty()) g.emit(c.index, std::move(shown));
  if (c.text.stopped()) {
    end(c, "stop");
    return false;
  }
  if (c.n_generated >= c.open->max_tokens) {
    end(c, "length");
    return false;
  }
  c.pending = t;
  return true;
}

void PlainDecoder::end(Decoding& c, const std::string& reason) {
  Open& open = *c.open;
  const std::string text = c.text.text();
  if (std::string rest = c.text.finish(text); !rest.empty()) open.g->emit(c.index, std::move(rest));
  serve::Choice& out = open.result.choices[c.index];
  out.text = text;
  out.finish_reason = reason;
  out.stop_string = c.text.stop_string();
  out.n_generated = c.n_generated;
  open.result.completion_tokens += c.n_generated;
  cache_.release(c.slot, open.g->request().keep_for);
  if (--open.remaining == 0) {
    open.result.total_ms = open.g->ms_since_created();
    open.g->finish(std::move(open.result));
  }
}

void PlainDecoder::fail(const std::vector<bool>& processed, const std::vector<bool>& goes_on,
                        const std::exception_ptr& error) {
  // Generations with a choice the failed step did not reach end with the error, all their choices with them;
  // choices the step ended are already released.
  std::map<Open*, std::shared_ptr<Open>> failed;
  for (size_t i = 0; i < choices_.size(); ++i)
    if (!processed[i]) failed.emplace(choices_[i].open.get(), choices_[i].open);
  std::vector<Decoding> kept;
  for (size_t i = 0; i < choices_.size(); ++i) {
    Decoding& c = choices_[i];
    if (processed[i] && !goes_on[i]) continue;
    if (!failed.count(c.open.get())) {
      kept.push_back(std::move(c));
      continue;
    }
    cache_.session(c.slot).reset();
    cache_.release(c.slot);
  }
  for (auto& [raw, open] : failed) open->g->fail(error);
  choices_ = std::move(kept);
}

void PlainDecoder::step() {
  // Choices of one model decode together; a server has one model per weights file and adapter stack.
  std::map<int, std::vector<size_t>> by_model;
  size_t room = 0;
  for (size_t i = 0; i < choices_.size(); ++i) {
    by_model[choices_[i].open->g->request().model].push_back(i);
    room += cache_.bytes_to_grow(choices_[i].slot, 1);
  }
  cache_.make_room(room);
  std::vector<bool> goes_on(choices_.size(), false), processed(choices_.size(), false);
  try {
    for (const auto& [model, rows] : by_model) {
      std::vector<model::Session*> sessions;
      std::vector<model::Token> tokens;
      for (size_t i : rows) {
        sessions.push_back(&cache_.session(choices_[i].slot));
        tokens.push_back(choices_[i].pending);
      }
      std::vector<float> logits;
      model::Session::decode_together(sessions, tokens, &logits);
      ++stats_.steps;
      stats_.step_rows += rows.size();
      const size_t n_vocab = logits.size() / rows.size();
      for (size_t k = 0; k < rows.size(); ++k) {
        processed[rows[k]] = true;
        goes_on[rows[k]] = advance(choices_[rows[k]], std::span(logits).subspan(k * n_vocab, n_vocab));
      }
    }
  } catch (const InputError&) {
    return fail(processed, goes_on, std::make_exception_ptr(out_of_room()));
  } catch (...) {
    return fail(processed, goes_on, std::current_exception());
  }
  std::vector<Decoding> kept;
  for (size_t i = 0; i < choices_.size(); ++i)
    if (goes_on[i]) kept.push_back(std::move(choices_[i]));
  choices_ = std::move(kept);
}

}  // namespace choreo::serve
