// The public header is enough to run the example it documents.

#include <choreo/choreo.h>

#include <doctest/doctest.h>

#include "tests/test_paths.h"

TEST_CASE("public API: the example in include/choreo/choreo.h runs as written") {
  auto backend = choreo::kernels::make_cpu_backend(2);
  auto model = choreo::model::Model::load(choreo::testing::shared_file("models/stories260K.gguf"), *backend);
  choreo::kv::PagePool pool(model->backend(), model->kv_layout(32), size_t(256) << 20);
  choreo::runtime::Engine engine(*model, pool);
  auto sys = engine.prefill({model->vocab().tokenize("Once upon a time", false)});
  REQUIRE(model->vocab().find(",") >= 0);
  choreo::runtime::DecodeRequest d;
  d.header = {model->vocab().find(",")};  // the comma token itself (tokenize would add SPM's space prefix)
  d.parents = {{sys.id}};
  d.sampling.temperature = 0;
  d.max_tokens = 8;
  auto answer = engine.decode(d);
  CHECK(answer.generated.size() == 8);
  // shared/README.md gives the greedy continuation of "Once upon a time" (after its comma).
  const std::string known = " there was a little girl named Lily. She loved to play outside in the park.";
  CHECK(!answer.text.empty());
  CHECK(known.starts_with(answer.text));
  CHECK(answer.stats.n_reused == 4);
}
