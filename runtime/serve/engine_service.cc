#include "runtime/serve/engine_service.h"

#include <utility>

namespace choreo::serve {

namespace {

/// How long the first extension request of a group waits for others to join it: requests that clients send at
/// once reach the engine thread a little apart, and a group's decodes share every forward pass.
constexpr std::chrono::milliseconds kGatherWindow{5};

}  // namespace

EngineService::EngineService(std::unique_ptr<runtime::OpenedEngine> opened, ExtensionOptions extensions)
    : opened_(std::move(opened)), models_(opened_->engine().models()), plain_(models_, opened_->pool()),
      choreo_(opened_->engine(), extensions.pins, extensions.max_names) {
  // Room for a group's messages: idle plain sessions go first (messages can move down the tiers instead).
  choreo_.set_make_room([this](size_t bytes) { plain_.make_room(bytes); });
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

void EngineService::start(std::shared_ptr<ExtensionGeneration> g) {
  {
    std::lock_guard lock(mutex_);
    if (extensions_arrived_.empty()) first_extension_ = std::chrono::steady_clock::now();
    extensions_arrived_.push_back(std::move(g));
  }
  wake_.notify_all();
}

EngineService::Snapshot EngineService::snapshot() {
  return run([this](runtime::Engine&) {
    Snapshot s;
    s.plain = plain_.stats();
    s.extensions = choreo_.stats();
    s.hints = choreo_.hints().stats();
    s.pinned_bytes = choreo_.hints().pinned_bytes();
    s.names = choreo_.names();
    s.tiers = opened_->engine().tier_stats();
    s.t1_in_use_bytes = opened_->engine().host_bytes_in_use();
    s.t1_budget_bytes = opened_->engine().tier_settings().host_bytes;
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
    // The decoders are the engine thread's alone: reading them under the lock is reading them on their thread.
    const auto work = [&] { return !jobs_.empty() || !arrived_.empty() || !extensions_arrived_.empty() || plain_.active(); };
    wake_.wait(lock, [&] { return stopping_ || work(); });
    if (!work()) return;  // stopping, nothing left
    if (!jobs_.empty()) {
      std::function<void(runtime::Engine&)> job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job(opened_->engine());  // a packaged task: what it throws goes to its caller
      lock.lock();
      continue;
    }
    // Extension requests arriving together run as one group: with nothing else to do, the first one waits a
    // moment for the others.
    if (arrived_.empty() && !plain_.active() && !extensions_arrived_.empty() && !stopping_ &&
        wake_.wait_until(lock, first_extension_ + kGatherWindow, [&] { return stopping_ || !jobs_.empty(); }))
      continue;
    std::vector<std::shared_ptr<PlainGeneration>> arrived = std::move(arrived_);
    arrived_.clear();
    std::vector<std::shared_ptr<ExtensionGeneration>> group = std::move(extensions_arrived_);
    extensions_arrived_.clear();
    lock.unlock();
    for (const auto& g : arrived) plain_.admit(g);
    std::vector<std::shared_ptr<ExtensionGeneration>> deferred;
    if (!group.empty()) deferred = choreo_.run(std::move(group));
    if (plain_.active()) plain_.step();
    lock.lock();
    if (!deferred.empty()) {
      if (extensions_arrived_.empty()) first_extension_ = std::chrono::steady_clock::now();
      extensions_arrived_.insert(extensions_arrived_.begin(), deferred.begin(), deferred.end());
    }
  }
}

}  // namespace choreo::serve
