#include "runtime/serve/engine_service.h"

#include <utility>

namespace choreo::serve {

EngineService::EngineService(std::unique_ptr<runtime::OpenedEngine> opened)
    : opened_(std::move(opened)), models_(opened_->engine().models()), plain_(models_, opened_->pool()) {
  thread_ = std::thread([this] { loop(); });
}

EngineService::~EngineService() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void EngineService::start(std::shared_ptr<PlainGeneration> g) {
  {
    std::lock_guard lock(mutex_);
    arrived_.push_back(std::move(g));
  }
  wake_.notify_all();
}

EngineService::Snapshot EngineService::snapshot() {
  return run([this](runtime::Engine&) {
    Snapshot s;
    s.plain = plain_.stats();
    s.cache = plain_.cache().stats();
    s.sessions = plain_.cache().sessions();
    s.t0_in_use_bytes = opened_->pool().bytes_in_use();
    s.t0_budget_bytes = opened_->pool().budget_bytes();
    return s;
  });
}

void EngineService::enqueue_job(std::function<void(runtime::Engine&)> job) {
  {
    std::lock_guard lock(mutex_);
    jobs_.push_back(std::move(job));
  }
  wake_.notify_all();
}

void EngineService::loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    // plain_ is the engine thread's alone: reading it under the lock is reading it on its own thread.
    wake_.wait(lock, [&] { return stopping_ || !jobs_.empty() || !arrived_.empty() || plain_.active(); });
    if (jobs_.empty() && arrived_.empty() && !plain_.active()) return;  // stopping, nothing left
    if (!jobs_.empty()) {
      std::function<void(runtime::Engine&)> job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job(opened_->engine());  // a packaged task: what it throws goes to its caller
      lock.lock();
      continue;
    }
    std::vector<std::shared_ptr<PlainGeneration>> arrived = std::move(arrived_);
    arrived_.clear();
    lock.unlock();
    for (const auto& g : arrived) plain_.admit(g);
    if (plain_.active()) plain_.step();
    lock.lock();
  }
}

}  // namespace choreo::serve
