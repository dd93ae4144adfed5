#pragma once
// Where a workflow interpreter sends its engine calls. One interpreter talks to the engine directly; many
// interpreters (one per workflow instance, each on its own thread) talk to a BatchScheduler, which merges the
// calls they have ready into one engine batch (runtime/exec/scheduler.h).

#include <vector>

#include "runtime/engine/engine.h"

namespace choreo::exec {

/// Receives batches of engine calls and returns their results in request order.
class CallSink {
 public:
  virtual ~CallSink() = default;
  virtual std::vector<runtime::PrefillResult> prefill_batch(std::vector<runtime::PrefillRequest> requests) = 0;
  virtual std::vector<runtime::DecodeResult> decode_batch(std::vector<runtime::DecodeRequest> requests) = 0;
  /// The engine the calls end up on; read it only from the thread that owns it (see scheduler.h).
  virtual const model::Model& model() const = 0;
  /// The engine's models (runtime/engine/model_set.h): what a call's `model:` names.
  virtual const runtime::ModelSet& models() const = 0;
  /// Where the instance registers its steps-to-execution oracle (the engine's registry).
  virtual runtime::StepOracleRegistry& step_oracles() = 0;
};

/// Sends each batch straight to one engine, on the calling thread.
class DirectSink final : public CallSink {
 public:
  explicit DirectSink(runtime::Engine& engine) : engine_(engine) {}
  std::vector<runtime::PrefillResult> prefill_batch(std::vector<runtime::PrefillRequest> requests) override {
    return engine_.prefill_batch(requests);
  }
  std::vector<runtime::DecodeResult> decode_batch(std::vector<runtime::DecodeRequest> requests) override {
    return engine_.decode_batch(requests);
  }
  const model::Model& model() const override { return engine_.model(); }
  const runtime::ModelSet& models() const override { return engine_.models(); }
  runtime::StepOracleRegistry& step_oracles() override { return engine_.step_oracles(); }

 private:
  runtime::Engine& engine_;
};

}  // namespace choreo::exec
