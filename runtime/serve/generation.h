#pragma once
// A generation of `choreo serve` as the request's thread and the engine thread share it: the engine thread
// fills it (the prompt's usage once evaluated, text as it is decoded, the end), the request's thread waits on
// it and writes what it gets to the client, and cancels it when the client is gone. Plain generations
// (runtime/serve/plain_decoder.h) and those with choreo's extensions (runtime/serve/choreo_decoder.h) both
// report through it.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/serve/request.h"

namespace choreo::serve {

/// Text a choice may show now.
struct TextEvent {
  size_t choice = 0;
  std::string text;
};

/// One generation in flight.
class Generation {
 public:
  Generation() : created_(std::chrono::steady_clock::now()) {}
  virtual ~Generation() = default;
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  // The request's thread.
  /// Waits for text or the end. Moves the text out into `events`; false once the generation has ended and
  /// everything was taken.
  bool next(std::vector<TextEvent>* events);
  /// As next(), but returns after `poll` at the latest: then `events` is empty and *timed_out is set (so that
  /// the caller can look at its client meanwhile).
  bool next_for(std::vector<TextEvent>* events, std::chrono::milliseconds poll, bool* timed_out);
  /// Waits at most `poll` for the end; true once the generation has ended.
  bool ended_within(std::chrono::milliseconds poll);
  /// Waits at most `poll` for the prompt's evaluation (or the end); true once either came.
  bool admitted_within(std::chrono::milliseconds poll);
  /// Waits until the prompt is evaluated; its usage, or what the generation threw.
  PromptUsage wait_admitted();
  /// The client is gone: the choices stop before their next token.
  void cancel() { cancelled_ = true; }
  /// Waits for the end; the result, or what the generation threw.
  GenerationResult wait();

  // The engine thread.
  bool cancelled() const { return cancelled_; }
  void admitted(const PromptUsage& usage);
  void emit(size_t choice, std::string text);
  void finish(GenerationResult result);
  void fail(std::exception_ptr error);
  std::chrono::steady_clock::time_point created() const { return created_; }
  /// Milliseconds since the request was handed to the engine thread.
  double ms_since_created() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - created_).count();
  }

 private:
  std::chrono::steady_clock::time_point created_;
  std::atomic<bool> cancelled_{false};
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<TextEvent> events_;
  bool done_ = false;
  std::optional<PromptUsage> usage_;
  GenerationResult result_;
  std::exception_ptr error_;
};

}  // namespace choreo::serve
