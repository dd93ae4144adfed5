// The engine over the persistent store (Engine::set_disk_store / persist / load): encodings saved by one
// engine are loaded by another, with a new page pool, instead of being computed, and give exactly the logits
// a fresh run gives; an unusable file (corrupt page, other model, other layout, truncated) is reported once
// and the message is re-encoded with the correct output.

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "kernels/backend.h"
#include "common/error.h"
#include "runtime/engine/engine.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/llama.h"
#include "runtime/store/disk_store.h"
#include "tests/runtime/store_test_util.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

namespace fs = std::filesystem;
using runtime::DecodeRequest;
using runtime::Engine;
using runtime::PrefillRequest;

struct Stories {
  std::unique_ptr<kernels::Backend> backend = kernels::make_cpu_backend(2);
  std::unique_ptr<model::Model> model;
  Stories() { model = model::Model::load(testing::shared_file("models/stories260K.gguf"), *backend); }
};

Stories& stories() {
  static Stories s;
  return s;
}

std::vector<model::Token> text(const std::string& s) { return stories().model->vocab().tokenize(s, false); }

constexpr int kPageTokens = 8;  // small pages: every message spans several

/// The workload: A, then B encoded over A, then a greedy decode over [A, B]. Returns every step's logits.
struct Run {
  kv::PagePool pool{stories().model->backend(), stories().model->kv_layout(kPageTokens), size_t(256) << 20};
  Engine engine{*stories().model, pool};
  runtime::PrefillResult a, b;
  std::vector<std::vector<float>> logits;

  explicit Run(store::DiskStore* disk) {
    if (disk) engine.set_disk_store(disk);
    a = engine.prefill(
        {text("Once upon a time there was a little cat named Tom who liked the sun."), {}, {}, "", {}});
    b = engine.prefill(
        {text(" One day Tom went to the park with his big red ball."), {{a.id, {}, {}}}, {}, "", {}});
    DecodeRequest d;
    d.header = text(" Then");
    d.parents = {{a.id, {}, {}}, {b.id, {}, {}}};
    d.sampling.temperature = 0;
    d.max_tokens = 12;
    d.exact_tokens = 12;
    d.record_logits = true;
    logits = engine.decode(d).logits;
  }
};

using testing::Warnings;

void flip_byte(const std::string& path, uint64_t from_end) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  const auto at = std::streamoff(fs::file_size(path) - from_end);
  char c = 0;
  f.seekg(at);
  f.read(&c, 1);
  c ^= 0x01;
  f.seekp(at);
  f.write(&c, 1);
}

TEST_CASE(
    "store + engine: persisted messages load into a new engine and pool, uncomputed, with identical logits") {
  testing::ScratchDir dir;
  Warnings w;
  store::DiskStore disk(dir.str(), true, w.sink());
  Run fresh(nullptr);  // the reference: everything computed, no store
  REQUIRE(fresh.logits.size() == 12);
  CHECK(fresh.b.stats.n_computed > kPageTokens);

  uint64_t key_a = 0, key_b = 0;
  {
    Run writer(&disk);
    CHECK(writer.a.stats.n_computed > 0);
    CHECK(!writer.a.loaded);
    CHECK(writer.logits == fresh.logits);
    key_a = writer.engine.store().get(writer.a.id).key;
    key_b = writer.engine.store().get(writer.b.id).key;
    writer.engine.persist(writer.b.id, 0xabcdef);  // persists A too: B cannot be loaded without it
  }
  CHECK(fs::exists(disk.entry_path(key_a)));
  CHECK(fs::exists(disk.entry_path(key_b)));

  SUBCASE("prefill of the same text loads instead of computing") {
    Run reader(&disk);
    CHECK(reader.a.loaded);
    CHECK(reader.b.loaded);
    CHECK(reader.a.stats.n_computed == 0);
    CHECK(reader.b.stats.n_computed == 0);
    CHECK(reader.b.stats.n_reused ==
          int(text(" One day Tom went to the park with his big red ball.").size()) +
              int(text("Once upon a time there was a little cat named Tom who liked the sun.").size()));
    CHECK(reader.logits == fresh.logits);  // exact: the same bytes
    CHECK(w.lines.empty());
  }
  SUBCASE("load by key alone brings the parents in first") {
    kv::PagePool pool(stories().model->backend(), stories().model->kv_layout(kPageTokens), size_t(256) << 20);
    Engine e(*stories().model, pool);
    e.set_disk_store(&disk);
    std::optional<kv::MessageId> b = e.load(key_b);
    REQUIRE(b);
    REQUIRE(e.store().find(key_a) != nullptr);
    kv::MessageId a = e.store().find(key_a)->id;
    CHECK(e.store().get(*b).parents.size() == 1);
    CHECK(e.store().get(*b).parents[0].message == a);
    DecodeRequest d;
    d.header = text(" Then");
    d.parents = {{a, {}, {}}, {*b, {}, {}}};
    d.sampling.temperature = 0;
    d.exact_tokens = 12;
    d.record_logits = true;
    CHECK(e.decode(d).logits == fresh.logits);
    CHECK(!e.load(key_b ^ 1));  // a key nobody stored
  }
  SUBCASE("a corrupted page byte is detected once, the message re-encoded, and persisting repairs the file") {
    flip_byte(disk.entry_path(key_b), 3);
    {
      Run reader(&disk);
      CHECK(reader.a.loaded);
      CHECK(!reader.b.loaded);
      CHECK(reader.b.stats.n_computed > 0);
      CHECK(reader.logits == fresh.logits);
      REQUIRE(w.lines.size() == 1);
      CHECK(w.lines[0].find("page checksum") != std::string::npos);
      Run again(&disk);  // same process, same file: no second report
      CHECK(w.lines.size() == 1);
      reader.engine.persist(reader.b.id);
    }
    Run repaired(&disk);
    CHECK(repaired.b.loaded);
    CHECK(repaired.logits == fresh.logits);
  }
  SUBCASE("an entry written by another model is ignored") {
    // Rewrite B's file with the same key and contents but another fingerprint.
    const store::Opened m =
        disk.open(key_b, {stories().model->fingerprint(), stories().model->kv_layout(kPageTokens)});
    REQUIRE(m);
    store::EntryMeta meta = m.entry->meta();
    meta.model_fingerprint ^= 0x1;
    std::vector<const std::byte*> pages;
    for (size_t i = 0; i < meta.n_pages(); ++i) pages.push_back(store::entry_page(m.entry->bytes(), m.entry->parsed(), i));
    disk.save(meta, pages);
    Run reader(&disk);
    CHECK(reader.a.loaded);
    CHECK(!reader.b.loaded);
    CHECK(reader.logits == fresh.logits);
    REQUIRE(w.lines.size() == 1);
    CHECK(w.lines[0].find("another model") != std::string::npos);
  }
  SUBCASE("a truncated entry is ignored") {
    fs::resize_file(disk.entry_path(key_a), fs::file_size(disk.entry_path(key_a)) - 100);
    Run reader(&disk);
    CHECK(!reader.a.loaded);
    CHECK(reader.b.loaded);  // B's key does not depend on how A got into memory
    CHECK(reader.logits == fresh.logits);
    REQUIRE(w.lines.size() == 1);
    CHECK(w.lines[0].find("truncated") != std::string::npos);
  }
  SUBCASE("an engine with another page size ignores entries of this layout") {
    kv::PagePool pool(stories().model->backend(), stories().model->kv_layout(kPageTokens * 2), size_t(256) << 20);
    Engine e(*stories().model, pool);
    e.set_disk_store(&disk);
    runtime::PrefillResult a = e.prefill(
        {text("Once upon a time there was a little cat named Tom who liked the sun."), {}, {}, "", {}});
    CHECK(!a.loaded);
    CHECK(a.stats.n_computed > 0);
    REQUIRE(w.lines.size() == 1);
    CHECK(w.lines[0].find("layout") != std::string::npos);
  }
}

TEST_CASE(
    "store + engine: persist writes each message of a diamond ancestry once, then only the message and what "
    "the store lacks") {
  testing::ScratchDir dir;
  store::DiskStore disk(dir.str());
  kv::PagePool pool(stories().model->backend(), stories().model->kv_layout(kPageTokens), size_t(64) << 20);
  Engine e(*stories().model, pool);
  e.set_disk_store(&disk);
  const kv::MessageId a = e.prefill({text("The dog ran."), {}, {}, "", {}}).id;
  const kv::MessageId b = e.prefill({text(" It was happy."), {{a, {}, {}}}, {}, "", {}}).id;
  const kv::MessageId c = e.prefill({text(" It was sad."), {{a, {}, {}}}, {}, "", {}}).id;
  const kv::MessageId d = e.prefill({text(" Then it slept."), {{b, {}, {}}, {c, {}, {}}}, {}, "", {}}).id;
  e.persist(d);
  CHECK(disk.entries_written() == 4);  // A once, although two paths lead to it
  CHECK(disk.list().size() == 4);
  e.persist(d);
  CHECK(disk.entries_written() == 5);  // D itself again; its ancestors are there
  REQUIRE(disk.remove(e.store().get(b).key));
  e.persist(d);
  CHECK(disk.entries_written() == 7);  // B (gone) and D
  kv::PagePool pool2(stories().model->backend(), stories().model->kv_layout(kPageTokens), size_t(64) << 20);
  Engine reader(*stories().model, pool2);
  reader.set_disk_store(&disk);
  CHECK(reader.load(e.store().get(d).key).has_value());
}

TEST_CASE("store + engine: persist_prefills saves every computed prefill, without a store nothing changes") {
  testing::ScratchDir dir;
  store::DiskStore disk(dir.str());
  {
    kv::PagePool pool(stories().model->backend(), stories().model->kv_layout(kPageTokens), size_t(64) << 20);
    Engine e(*stories().model, pool);
    e.set_disk_store(&disk, true);
    runtime::PrefillResult a = e.prefill({text("The dog ran."), {}, {}, "", {}});
    runtime::PrefillResult b = e.prefill({text(" It was happy."), {{a.id, {}, {}}}, {}, "", {}});
    CHECK(disk.list().size() == 2);
    CHECK_THROWS_AS(e.persist(kv::MessageId(9999)), InputError);
    (void)b;
  }
  kv::PagePool pool(stories().model->backend(), stories().model->kv_layout(kPageTokens), size_t(64) << 20);
  Engine plain(*stories().model, pool);  // no store set: computes as always
  runtime::PrefillResult a = plain.prefill({text("The dog ran."), {}, {}, "", {}});
  CHECK(!a.loaded);
  CHECK(a.stats.n_computed > 0);
  CHECK_THROWS_AS(plain.persist(a.id), InputError);
}

}  // namespace
}  // namespace choreo
