#include "runtime/serve/generation.h"

namespace choreo::serve {

bool Generation::next(std::vector<TextEvent>* events) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return done_ || !events_.empty(); });
  events->assign(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
  events_.clear();
  return !events->empty() || !done_;
}

bool Generation::next_for(std::vector<TextEvent>* events, std::chrono::milliseconds poll, bool* timed_out) {
  std::unique_lock lock(mutex_);
  *timed_out = !changed_.wait_for(lock, poll, [&] { return done_ || !events_.empty(); });
  events->assign(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
  events_.clear();
  return *timed_out || !events->empty() || !done_;
}

bool Generation::ended_within(std::chrono::milliseconds poll) {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, poll, [&] { return done_; });
}

bool Generation::admitted_within(std::chrono::milliseconds poll) {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, poll, [&] { return done_ || usage_; });
}

GenerationResult Generation::wait() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return done_; });
  if (error_) std::rethrow_exception(error_);
  return result_;
}

PromptUsage Generation::wait_admitted() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return done_ || usage_; });
  if (error_) std::rethrow_exception(error_);
  return usage_ ? *usage_ : result_.usage;
}

void Generation::admitted(const PromptUsage& usage) {
  {
    std::lock_guard lock(mutex_);
    usage_ = usage;
  }
  changed_.notify_all();
}

void Generation::emit(size_t choice, std::string text) {
  {
    std::lock_guard lock(mutex_);
    events_.push_back({choice, std::move(text)});
  }
  changed_.notify_all();
}

void Generation::finish(GenerationResult result) {
  {
    std::lock_guard lock(mutex_);
    result_ = std::move(result);
    done_ = true;
  }
  changed_.notify_all();
}

void Generation::fail(std::exception_ptr error) {
  {
    std::lock_guard lock(mutex_);
    error_ = std::move(error);
    done_ = true;
  }
  changed_.notify_all();
}

}  // namespace choreo::serve
