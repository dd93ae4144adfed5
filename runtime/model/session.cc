#include "runtime/model/session.h"

#include <algorithm>
#include <stdexcept>

#include "common/error.h"

namespace choreo::model {

Session::Session(const Model& model, kv::PagePool& pool, int max_batch)
    : model_(model), pages_(pool), max_batch_(max_batch), n_ctx_(model.config().n_ctx_train) {}

void Session::reset() {
  pages_.clear();
  tokens_.clear();
}

void Session::truncate(int n_tokens) {
  if (n_tokens >= 0 && n_tokens < n_past()) tokens_.resize(size_t(n_tokens));
}

void Session::copy_prefix_from(const Session& other, int n_tokens) {
  if (&other == this) return truncate(n_tokens);
  if (&other.model_ != &model_ || other.pages_.page_tokens() != pages_.page_tokens())
    throw std::invalid_argument("copy_prefix_from: a session of another model or layout");
  n_tokens = std::clamp(n_tokens, 0, other.n_past());
  tokens_.assign(other.tokens_.begin(), other.tokens_.begin() + n_tokens);
  if (n_tokens == 0) return;
  const size_t n_pages = size_t(n_tokens + pages_.page_tokens() - 1) / size_t(pages_.page_tokens());
  const std::vector<std::byte> host = other.pages_.to_host(n_pages);
  pages_.reserve(n_tokens);
  pages_.upload(host.data(), n_pages);
}

void Session::decode_together(std::span<Session* const> sessions, std::span<const Token> tokens,
                              std::vector<float>* logits) {
  if (sessions.empty()) return;
  if (tokens.size() != sessions.size()) throw std::invalid_argument("decode_together: one token per session");
  Session& first = *sessions[0];
  const Model& model = first.model_;
  for (Session* s : sessions) {
    if (&s->model_ != &model) throw std::invalid_argument("decode_together: sessions of different models");
    if (s->n_past() + 1 > s->n_ctx_)
      throw InputError(fmt::format("context overflow: {} tokens exceed the model's context of {}", s->n_past() + 1,
                                   s->n_ctx_),
                       "shorten the prompt or lower -n");
    s->pages_.reserve(s->n_past() + 1);  // before any span of the pages is taken below
  }
  model.check_tokens(tokens);
  Batch& batch = first.batch_;
  batch.clear();
  batch.kv = first.pages_.pool().layout();
  for (size_t i = 0; i < sessions.size(); ++i) {
    const Session& s = *sessions[i];
    const int pos = s.n_past();
    batch.tokens.push_back(tokens[i]);
    batch.positions.push_back(pos);
    batch.kv_page.push_back(s.pages_.page_of(pos));
    batch.kv_slot.push_back(s.pages_.slot_of(pos));
    Batch::Group g;
    g.q_begin = int(i);
    g.q_end = int(i) + 1;
    kernels::KvSegment own;
    own.pages = s.pages_.pages();
    own.n_tokens = pos + 1;
    own.causal_base = pos;
    g.segments.push_back(own);
    g.lora = s.lora_;
    batch.groups.push_back(std::move(g));
    batch.logit_rows.push_back(int(i));
  }
  logits->resize(sessions.size() * size_t(model.config().n_vocab));
  model.forward(batch, first.state_, logits->data());
  for (size_t i = 0; i < sessions.size(); ++i) sessions[i]->tokens_.push_back(tokens[i]);
}

void Session::eval(std::span<const Token> tokens, std::vector<float>* last_logits,
                   std::vector<float>* all_logits) {
  const int n_vocab = model_.config().n_vocab;
  const int total = n_past() + int(tokens.size());
  if (total > n_ctx_) {
    throw InputError(fmt::format("context overflow: {} tokens exceed the model's context of {}", total, n_ctx_),
                     "shorten the prompt or lower -n");
  }
  model_.check_tokens(tokens);
  pages_.reserve(total);
  if (all_logits) all_logits->assign(tokens.size() * size_t(n_vocab), 0.0f);
  std::vector<float> chunk_logits;
  size_t done = 0;
  while (done < tokens.size()) {
    const int n = int(std::min<size_t>(max_batch_, tokens.size() - done));
    const int base = n_past();
    batch_.clear();
    batch_.kv = pages_.pool().layout();
    for (int i = 0; i < n; ++i) {
      batch_.tokens.push_back(tokens[done + i]);
      batch_.positions.push_back(base + i);
      batch_.kv_page.push_back(pages_.page_of(base + i));
      batch_.kv_slot.push_back(pages_.slot_of(base + i));
    }
    Batch::Group g;
    g.q_begin = 0;
    g.q_end = n;
    kernels::KvSegment own;
    own.pages = pages_.pages();
    own.n_tokens = base + n;
    own.causal_base = base;
    g.segments.push_back(own);
    g.lora = lora_;
    batch_.groups.push_back(std::move(g));
    if (all_logits) {
      for (int i = 0; i < n; ++i) batch_.logit_rows.push_back(i);
    } else if (done + n == tokens.size() && last_logits) {
      batch_.logit_rows.push_back(n - 1);
    }
    chunk_logits.resize(batch_.logit_rows.size() * size_t(n_vocab));
    model_.forward(batch_, state_, chunk_logits.data());
    tokens_.insert(tokens_.end(), tokens.begin() + done, tokens.begin() + done + n);
    if (all_logits) std::copy(chunk_logits.begin(), chunk_logits.end(), all_logits->begin() + done * n_vocab);
    done += n;
  }
  if (last_logits && !tokens.empty()) {
    if (all_logits) {
      last_logits->assign(all_logits->end() - n_vocab, all_logits->end());
    } else {
      last_logits->assign(chunk_logits.end() - n_vocab, chunk_logits.end());
    }
  }
}

}  // namespace choreo::model
