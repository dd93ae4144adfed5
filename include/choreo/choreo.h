#pragma once
// choreo's public C++ API: load a GGUF model, open an engine over a KV page pool, and issue choreographed
// prefill/decode calls whose parents are earlier messages placed at chosen offsets (DESIGN.md §2).
//
//   auto backend = choreo::kernels::make_cpu_backend(/*n_threads=*/2);
//   auto model = choreo::model::Model::load("SmolLM2-135M-Instruct.Q4_1.gguf", *backend);
//   choreo::kv::PagePool pool(model->kv_layout(/*page_tokens=*/32), /*budget_bytes=*/size_t(2) << 30);
//   choreo::runtime::Engine engine(*model, pool);            // Mode::Choreo; Naive/Prefix are baselines
//   auto sys = engine.prefill({model->vocab().tokenize("You are terse.", false)});
//   choreo::runtime::DecodeRequest d;
//   d.header = model->vocab().tokenize(" Answer:", false);
//   d.parents = {{sys.id}};                                   // offsets omitted: defaults of DESIGN.md §2
//   d.sampling.temperature = 0;
//   d.max_tokens = 32;
//   auto answer = engine.decode(d);                           // answer.text, answer.generated, answer.stats
//
// Errors a caller can cause (bad file, unknown parent, context overflow) throw choreo::InputError.

#include "kernels/backend.h"           // Backend, make_cpu_backend
#include "common/error.h"      // InputError, RuntimeFailure
#include "runtime/engine/engine.h"     // Engine, PrefillRequest, DecodeRequest, Parent, Mode
#include "runtime/kv/message_store.h"  // MessageId, Message
#include "runtime/kv/page_pool.h"      // PagePool
#include "runtime/model/chat_template.h"
#include "runtime/model/llama.h"       // Model
#include "runtime/model/sampler.h"     // SamplingParams
#include "runtime/model/vocab.h"       // Vocab, Token
