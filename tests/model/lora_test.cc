// LoRA adapters at run time (runtime/model/lora.h): batches that mix adapters, scale 0, content keys, and bad
// adapter files. The comparison with llama.cpp is in llama_reference_test.cc.

#include <cstring>

#include <doctest/doctest.h>

#include "common/error.h"
#include "runtime/engine/engine.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/lora.h"
#include "runtime/model/sampler.h"
#include "runtime/model/session.h"
#include "runtime/store/disk_store.h"
#include "tests/cli_process.h"
#include "tests/model/lora_fixtures.h"
#include "tests/scratch_dir.h"
#include "tests/test_models.h"

namespace choreo {
namespace {

using model::LoraAdapter;
using model::LoraStack;

/// `choreo ARGS... -m <the default model>`, to the end.
testing::ProcessResult cli(std::vector<std::string> args) {
  testing::ScratchDir scratch;
  args.insert(args.end(), {"-m", testing::require_file(testing::default_model())});
  return testing::run_process(testing::choreo_binary(), args, scratch.path);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// The logits of `steps` greedy decode steps after `prompt`, one sequence alone.
std::vector<std::vector<float>> alone(const model::Model& m, const LoraStack* lora, const std::string& prompt,
                                      int steps, std::vector<model::Token>* path) {
  kv::PagePool pool(m.backend(), m.kv_layout(32), size_t(256) << 20);
  model::Session s(m, pool);
  s.set_lora(lora);
  std::vector<std::vector<float>> out(1);
  s.eval(m.vocab().tokenize(prompt, true, true), &out[0]);
  for (int i = 0; i < steps; ++i) {
    const model::Token t = model::argmax(out.back());
    path->push_back(t);
    out.emplace_back();
    s.eval(std::span<const model::Token>(&t, 1), &out.back());
  }
  return out;
}

TEST_CASE("LoRA: one batch mixing the base model and several adapter stacks equals each sequence run alone, bit for bit") {
  const model::Model& m = *testing::smollm2().model;
  testing::ScratchDir dir;
  const std::string shifted = (dir.path / "shifted.gguf").string();
  testing::write_shifted_math_lora(shifted);
  const auto math = LoraAdapter::load(testing::math_lora(), m);
  LoraStack one{{{math, 1.0f}}};
  LoraStack two{{{math, 0.7f}, {LoraAdapter::load(shifted, m), -0.4f}}};
  // Neighbours on one stack are one run of rows in the forward pass; the base rows are skipped.
  const std::vector<const LoraStack*> stacks = {nullptr, &one, &one, &two, nullptr, &two};
  const std::vector<std::string> prompts = {"The capital of France is", "Solve 2x + 3 = 7.", "Compute 17 * 23.",
                                            "Once upon a time", "List three colours:", "What is the derivative of x^2?"};
  constexpr int kSteps = 6;
  std::vector<std::vector<std::vector<float>>> expected;
  std::vector<std::vector<model::Token>> paths(stacks.size());
  for (size_t i = 0; i < stacks.size(); ++i) expected.push_back(alone(m, stacks[i], prompts[i], kSteps, &paths[i]));
  // The adapters change what the model says: the test would prove nothing if they did not.
  std::vector<model::Token> unused;
  CHECK_FALSE(same_bits(expected[1][0], alone(m, nullptr, prompts[1], 0, &unused)[0]));

  kv::PagePool pool(m.backend(), m.kv_layout(32), size_t(512) << 20);
  std::vector<std::unique_ptr<model::Session>> owned;
  std::vector<model::Session*> sessions;
  for (size_t i = 0; i < stacks.size(); ++i) {
    owned.push_back(std::make_unique<model::Session>(m, pool));
    owned.back()->set_lora(stacks[i]);
    sessions.push_back(owned.back().get());
    std::vector<float> logits;
    sessions.back()->eval(m.vocab().tokenize(prompts[i], true, true), &logits);
    CHECK(same_bits(logits, expected[i][0]));
  }
  const size_t n_vocab = size_t(m.config().n_vocab);
  for (int step = 0; step < kSteps; ++step) {
    std::vector<model::Token> tokens;
    for (size_t i = 0; i < stacks.size(); ++i) tokens.push_back(paths[i][size_t(step)]);
    std::vector<float> logits;
    model::Session::decode_together(sessions, tokens, &logits);
    for (size_t i = 0; i < stacks.size(); ++i) {
      CAPTURE(i);
      CAPTURE(step);
      const std::vector<float> row(logits.begin() + long(i * n_vocab), logits.begin() + long((i + 1) * n_vocab));
      CHECK(same_bits(row, expected[i][size_t(step) + 1]));
    }
  }
}

TEST_CASE("LoRA: an adapter at scale 0 gives the base model's logits bit for bit") {
  const model::Model& m = *testing::smollm2().model;
  LoraStack zero{{{LoraAdapter::load(testing::math_lora(), m), 0.0f}}};
  std::vector<model::Token> a, b;
  const auto base = alone(m, nullptr, "Explain why the sky is blue.", 4, &a);
  const auto scaled = alone(m, &zero, "Explain why the sky is blue.", 4, &b);
  CHECK(a == b);
  for (size_t i = 0; i < base.size(); ++i) CHECK(same_bits(base[i], scaled[i]));
}

TEST_CASE("LoRA: base, adapter and scale each give their own content keys, and no entry is read by another model") {
  const model::Model& m = *testing::smollm2().model;
  testing::ScratchDir dir;
  const std::string shifted = (dir.path / "shifted.gguf").string();
  testing::write_shifted_math_lora(shifted);
  const auto math = LoraAdapter::load(testing::math_lora(), m);
  const auto other = LoraAdapter::load(shifted, m);
  const std::vector<LoraStack> stacks = {
      LoraStack{}, LoraStack{{{math, 1.0f}}}, LoraStack{{{math, 0.5f}}}, LoraStack{{{other, 1.0f}}},
      LoraStack{{{math, 1.0f}, {other, 1.0f}}}, LoraStack{{{other, 1.0f}, {math, 1.0f}}}};
  std::vector<uint64_t> prints;
  for (const LoraStack& s : stacks) {
    kv::PagePool pool(m.backend(), m.kv_layout(32), size_t(64) << 20);
    runtime::Engine e(m, pool, runtime::Mode::Choreo, 512, &s);
    prints.push_back(e.weights_fingerprint());
  }
  CHECK(prints[0] == m.fingerprint());  // no adapter: the model's own keys, as before adapters existed
  for (size_t i = 0; i < prints.size(); ++i)
    for (size_t j = i + 1; j < prints.size(); ++j) CHECK(prints[i] != prints[j]);
  // The same adapter loaded again gives the same keys.
  LoraStack again{{{LoraAdapter::load(testing::math_lora(), m), 1.0f}}};
  kv::PagePool pool(m.backend(), m.kv_layout(32), size_t(64) << 20);
  CHECK(runtime::Engine(m, pool, runtime::Mode::Choreo, 512, &again).weights_fingerprint() == prints[1]);

  // Through a persistent store: a prefill saved under the adapter is loaded by the adapter's next engine, and
  // computed afresh by the base model's.
  store::DiskStore disk((dir.path / "store").string(), true);
  runtime::PrefillRequest req;
  req.tokens = m.vocab().tokenize("A passage every agent reads.", false, true);
  const auto prefill = [&](const LoraStack* lora) {
    kv::PagePool p(m.backend(), m.kv_layout(32), size_t(64) << 20);
    runtime::Engine e(m, p, runtime::Mode::Choreo, 512, lora);
    e.set_disk_store(&disk, /*persist_prefills=*/true);
    return e.prefill(req);
  };
  CHECK(prefill(&stacks[1]).stats.n_computed == int(req.tokens.size()));
  const runtime::PrefillResult reloaded = prefill(&stacks[1]);
  CHECK(reloaded.loaded);
  CHECK(reloaded.stats.n_computed == 0);
  CHECK(prefill(nullptr).stats.n_computed == int(req.tokens.size()));
  CHECK(prefill(&stacks[2]).stats.n_computed == int(req.tokens.size()));
}

TEST_CASE("LoRA: bad adapter files are clear errors naming the file and the tensor") {
  const model::Model& m = *testing::smollm2().model;
  testing::ScratchDir dir;
  const auto fails_with = [&](const std::string& path, const std::string& needle) {
    CAPTURE(needle);
    try {
      LoraAdapter::load(path, m);
      FAIL("loaded");
    } catch (const InputError& e) {
      const std::string what = e.what();
      CHECK(what.find(path) != std::string::npos);
      CHECK(what.find(needle) != std::string::npos);
    }
  };
  // A model given as an adapter.
  fails_with(testing::require_file(testing::default_model()), "not a LoRA adapter");
  // An adapter for another model: stories260K's shapes do not fit.
  {
    testing::LoadedModel& stories = testing::stories260k();
    try {
      LoraAdapter::load(testing::math_lora(), *stories.model);
      FAIL("loaded");
    } catch (const InputError& e) {
      CHECK(std::string(e.what()).find("blk.0.attn_q.weight.lora_a") != std::string::npos);
    }
  }
  const gguf::File src = gguf::File::open(testing::math_lora());
  const auto metadata = [&](const std::string& skip, const std::function<void(gguf::Writer&)>& add) {
    return [&src, skip, add](gguf::Writer& w) {
      for (const auto& [key, value] : src.metadata())
        if (key != skip) w.set(key, value);
      if (add) add(w);
    };
  };
  const auto same = [](const std::string& n) { return n; };
  const std::string neg = (dir.path / "neg-alpha.gguf").string();
  testing::write_adapter_from(testing::math_lora(), neg, same,
                              metadata("adapter.lora.alpha", [](gguf::Writer& w) { w.set_f32("adapter.lora.alpha", -1); }));
  fails_with(neg, "adapter.lora.alpha");
  const std::string not_lora = (dir.path / "not-lora.gguf").string();
  testing::write_adapter_from(testing::math_lora(), not_lora, same,
                              metadata("adapter.type", [](gguf::Writer& w) { w.set_string("adapter.type", "control_vector"); }));
  fails_with(not_lora, "adapter.type");

  // Tensor-level damage: a pair's partner missing, a layer past the model's, a rank that differs between A and B.
  const auto write_tensors = [&](const std::string& path, const std::function<void(gguf::Writer&)>& tensors) {
    gguf::Writer w;
    for (const auto& [key, value] : src.metadata()) w.set(key, value);
    tensors(w);
    w.write(path);
  };
  const auto copy = [&](gguf::Writer& w, const std::string& as, const std::string& from) {
    const gguf::TensorInfo* t = src.tensor(from);
    REQUIRE(t != nullptr);
    w.add_tensor(as, t->shape, t->type, std::vector<uint8_t>(t->data, t->data + t->n_bytes));
  };
  const std::string lone = (dir.path / "lone.gguf").string();
  write_tensors(lone, [&](gguf::Writer& w) { copy(w, "blk.0.attn_q.weight.lora_a", "blk.0.attn_q.weight.lora_a"); });
  fails_with(lone, "blk.0.attn_q.weight.lora_b");
  const std::string deep = (dir.path / "deep.gguf").string();
  write_tensors(deep, [&](gguf::Writer& w) {
    copy(w, "blk.30.attn_q.weight.lora_a", "blk.0.attn_q.weight.lora_a");
    copy(w, "blk.30.attn_q.weight.lora_b", "blk.0.attn_q.weight.lora_b");
  });
  fails_with(deep, "blk.30.attn_q.weight.lora_a");
  const std::string crossed = (dir.path / "crossed.gguf").string();
  write_tensors(crossed, [&](gguf::Writer& w) {
    copy(w, "blk.0.attn_q.weight.lora_a", "blk.0.attn_q.weight.lora_a");
    copy(w, "blk.0.attn_q.weight.lora_b", "blk.0.attn_k.weight.lora_b");  // B of k: 192 outputs, q has 576
  });
  fails_with(crossed, "blk.0.attn_q.weight.lora_b");
  const std::string embd = (dir.path / "embd.gguf").string();
  write_tensors(embd, [&](gguf::Writer& w) {
    copy(w, "token_embd.weight.lora_a", "blk.0.attn_q.weight.lora_a");
    copy(w, "token_embd.weight.lora_b", "blk.0.attn_q.weight.lora_b");
  });
  fails_with(embd, "token_embd.weight");

  // From the command line: exit code 2 and the message, before anything runs.
  const testing::ProcessResult r = cli({"generate", "-p", "Hi", "-n", "2", "--lora", lone});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("lora_b") != std::string::npos);
  const testing::ProcessResult missing = cli({"generate", "-p", "Hi", "-n", "2", "--lora", (dir.path / "none.gguf").string()});
  CHECK(missing.exit_code == 2);
}

TEST_CASE("LoRA: choreo generate --lora and --lora-scaled change the continuation as the adapter says") {
  // The math adapter writes MATH-style solutions; at scale 0 it is the base model (the test above).
  const std::vector<std::string> base_args = {"generate", "-p", "Solve for x: 3x + 5 = 20.", "-n", "16", "--temp", "0",
                                              "--chat"};
  const testing::ProcessResult base = cli(base_args);
  std::vector<std::string> with = base_args;
  with.insert(with.end(), {"--lora", testing::math_lora()});
  const testing::ProcessResult adapted = cli(with);
  std::vector<std::string> zero = base_args;
  zero.insert(zero.end(), {"--lora-scaled", testing::math_lora(), "0"});
  const testing::ProcessResult unscaled = cli(zero);
  REQUIRE(base.exit_code == 0);
  REQUIRE(adapted.exit_code == 0);
  REQUIRE(unscaled.exit_code == 0);
  CHECK(adapted.out != base.out);
  CHECK(unscaled.out == base.out);
}

}  // namespace
}  // namespace choreo
