// train_adapter (runtime/train/train_adapter.h), what `choreo finetune train` calls, on stories260K and the
// toy workflow (issue 42, findings 9 and 10):
// - the adapter's path and the checkpoint's beside it are checked before any work: a checkpoint path that
//   cannot be written (a directory, a FIFO) is refused with the adapter file given left as it was (at a18d5cf
//   the adapter was replaced after the first epoch, and then the checkpoint refused);
// - an adapter path that is a FIFO is written in place, as every output is (docs/limits.md), once, with the
//   bytes a file receives, and no checkpoint (at a18d5cf: refused after the first epoch);
// - a checkpoint carries a checksum: any flipped byte is refused, and nothing is read from it;
// - a resume with other optimiser or split settings is refused naming both values, files unchanged (at
//   a18d5cf a resume with another --lr went on silently).

#include "runtime/train/train_adapter.h"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "runtime/model/synth_lora.h"
#include "runtime/train/checkpoint.h"
#include "tests/scratch_dir.h"
#include "tests/test_models.h"
#include "tests/test_paths.h"
#include "tests/train/toy_traces.h"

namespace choreo {
namespace {

namespace fs = std::filesystem;

/// One epoch of a rank-2 adapter on the toy workflow's fixed traces, written to `out`.
struct ToyTraining {
  testing::ScratchDir dir;
  train::TrainAdapterOptions options;
  size_t n_started = 0;
  ToyTraining() {
    options.models.path = testing::shared_file("models/stories260K.gguf");
    options.models.n_threads = 2;
    options.workflow_path = (dir.path / "toy.yaml").string();
    std::ofstream(options.workflow_path) << testing::kToyWorkflow;
    options.traces_path = (dir.path / "traces.jsonl").string();
    testing::write_fixed_traces(options.traces_path);
    options.out_path = (dir.path / "toy.gguf").string();
    options.rank = 2;
    options.epochs = 1;
    options.lr = 1e-2;
    options.seed = 3;
    options.on_start = [this](const train::TrainAdapterReport&) { ++n_started; };
  }
  std::string checkpoint() const { return train::checkpoint_path(options.out_path); }
};

/// The rendered InputError of a train_adapter call that is refused, and no work done.
std::string refused(ToyTraining& t, const train::TrainAdapterOptions& options) {
  const size_t before = t.n_started;
  const std::string error = testing::input_error_text([&] { train::train_adapter(options); });
  CHECK(t.n_started == before);  // refused before the first epoch
  return error;
}

TEST_CASE(
    "train adapter: an unwritable checkpoint path is refused before any work, the adapter left as it was") {
  ToyTraining t;
  std::ofstream(t.options.out_path) << "an older adapter";
  // A directory where the checkpoint goes.
  fs::create_directory(t.checkpoint());
  const std::string dir_error = refused(t, t.options);
  CHECK(dir_error.find(t.checkpoint()) != std::string::npos);
  CHECK(testing::read_file(t.options.out_path) == "an older adapter");
  CHECK(fs::is_empty(t.checkpoint()));
  // A FIFO there: it could not be read back by --resume.
  fs::remove(t.checkpoint());
  REQUIRE(::mkfifo(t.checkpoint().c_str(), 0600) == 0);
  const std::string fifo_error = refused(t, t.options);
  CHECK(fifo_error.find("device or FIFO") != std::string::npos);
  CHECK(testing::read_file(t.options.out_path) == "an older adapter");
  CHECK(fs::is_fifo(fs::status(t.checkpoint())));
  // Not vacuous: with the path free, the same run trains and replaces the adapter.
  fs::remove(t.checkpoint());
  train::train_adapter(t.options);
  CHECK(t.n_started == 1);
  CHECK(testing::read_file(t.options.out_path) != "an older adapter");
  CHECK(fs::is_regular_file(t.checkpoint()));
}

TEST_CASE("train adapter: an adapter path that is a FIFO is written in place, once, with a file's bytes") {
  ToyTraining t;
  train::train_adapter(t.options);
  const std::string file_bytes = testing::read_file(t.options.out_path);
  REQUIRE(!file_bytes.empty());

  train::TrainAdapterOptions piped = t.options;
  piped.out_path = (t.dir.path / "pipe").string();
  REQUIRE(::mkfifo(piped.out_path.c_str(), 0600) == 0);
  std::string received;
  std::thread reader([&] { received = testing::read_file(piped.out_path); });  // until the writer closes it
  size_t n_written_epochs = 0;
  piped.on_epoch = [&](const train::EpochReport&, bool written) { n_written_epochs += written; };
  const train::TrainAdapterReport report = train::train_adapter(piped);
  reader.join();
  CHECK(received == file_bytes);
  CHECK(report.checkpoint.empty());
  CHECK(n_written_epochs == 0);
  CHECK(fs::is_fifo(fs::status(piped.out_path)));
  CHECK(!fs::exists(train::checkpoint_path(piped.out_path)));
  // No checkpoint: nothing to resume.
  piped.resume = true;
  CHECK(refused(t, piped).find("no checkpoint beside it") != std::string::npos);
}

TEST_CASE("train adapter: a resume with other settings is refused naming both values, the files unchanged") {
  ToyTraining t;
  train::train_adapter(t.options);
  const std::string adapter = testing::read_file(t.options.out_path),
                    checkpoint = testing::read_file(t.checkpoint());
  train::TrainAdapterOptions resume = t.options;
  resume.resume = true;
  resume.epochs = 2;
  const struct {
    std::function<void(train::TrainAdapterOptions&)> change;
    std::string then, now;
  } cases[] = {
      {[](auto& o) { o.lr = 1e-3; }, "--lr 0.01", "--lr 0.001"},
      {[](auto& o) { o.accumulate = 2; }, "--accumulate 1", "--accumulate 2"},
      {[](auto& o) { o.val = 0.25; }, "--val 0.1", "--val 0.25"},
      {[](auto& o) { o.rank = 3; }, "--rank 2", "--rank 3"},
      {[](auto& o) { o.alpha = 8; }, "--alpha 16", "--alpha 8"},
      {[](auto& o) { o.seed = 4; }, "--seed 3", "--seed 4"},
      {[](auto& o) { o.layers = "2-3"; }, "--layers all", "--layers 2-3"},
      {[](auto& o) { o.targets = "q,v"; }, "--targets q,k,v,o,gate,up,down", "--targets q,v"},
  };
  for (const auto& c : cases) {
    train::TrainAdapterOptions other = resume;
    c.change(other);
    const std::string error = refused(t, other);
    CAPTURE(error);
    CHECK(error.find(c.then + "; this run has " + c.now) != std::string::npos);
    CHECK(testing::read_file(t.options.out_path) == adapter);
    CHECK(testing::read_file(t.checkpoint()) == checkpoint);
  }
  // Not vacuous: with the same settings it resumes.
  const train::TrainAdapterReport resumed = train::train_adapter(resume);
  CHECK(resumed.resumed);
  CHECK(resumed.epochs_resumed == 1);
  CHECK(resumed.epochs_run == 1);
}

TEST_CASE("train adapter: a checkpoint with any byte flipped is refused, and nothing is read from it") {
  ToyTraining t;
  train::train_adapter(t.options);
  const std::string adapter = testing::read_file(t.options.out_path),
                    checkpoint = testing::read_file(t.checkpoint());
  // The settings, traces and model the checkpoint was written with, and pairs of its shape to read into.
  const model::Model& m = *testing::stories260k().model;
  const train::FrozenModel frozen = train::FrozenModel::dequantise(m);
  const std::vector<model::LoraTarget> targets = model::parse_lora_targets(t.options.targets);
  const auto fresh = [&] { return train::LoraParams<float>::init(frozen, targets, 2, 16.0f, 3); };
  const std::string traces = testing::read_file(t.options.traces_path);
  const train::CheckpointKey key{.rank = 2,
                                 .alpha = 16.0f,
                                 .targets = t.options.targets,
                                 .seed = 3,
                                 .lr = 1e-2,
                                 .accumulate = 1,
                                 .val = 0.1,
                                 .traces_xxh3 = XXH3_64bits(traces.data(), traces.size()),
                                 .model_fingerprint = m.fingerprint()};
  const auto read = [&](train::LoraParams<float>& lora) {
    train::TrainState state;
    return testing::input_error_text([&] { train::read_checkpoint(t.checkpoint(), key, lora, state); });
  };
  train::LoraParams<float> whole = fresh();
  REQUIRE(read(whole) == "(no InputError)");  // not vacuous: the file as written is read
  const auto same = [](train::LoraParams<float> a, train::LoraParams<float> b) {
    const std::vector<float*> x = a.values(), y = b.values();
    for (size_t i = 0; i < x.size(); ++i)
      if (*x[i] != *y[i]) return false;
    return x.size() == y.size();
  };
  CHECK(!same(whole, fresh()));  // it holds the trained values

  train::TrainAdapterOptions resume = t.options;
  resume.resume = true;
  resume.epochs = 2;
  const int fd = ::open(t.checkpoint().c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  const auto flip = [&](size_t at) {
    char byte = 0;
    REQUIRE(::pread(fd, &byte, 1, off_t(at)) == 1);
    byte = char(byte ^ 0x10);
    REQUIRE(::pwrite(fd, &byte, 1, off_t(at)) == 1);
  };
  // Every byte of the metadata, then every 97th byte of the tensors, and the last.
  std::vector<size_t> positions;
  for (size_t at = 0; at < checkpoint.size(); at += at < 2048 ? 1 : 97) positions.push_back(at);
  positions.push_back(checkpoint.size() - 1);
  size_t n_refused = 0;
  for (const size_t at : positions) {
    flip(at);
    train::LoraParams<float> lora = fresh();
    const std::string error = read(lora);
    flip(at);  // restored
    n_refused += error != "(no InputError)";
    CHECK_MESSAGE(error != "(no InputError)", "byte ", at);
    CHECK_MESSAGE(same(lora, fresh()), "byte ", at);  // nothing read from it
  }
  CHECK(n_refused == positions.size());
  CHECK(testing::read_file(t.checkpoint()) == checkpoint);
  // A damaged checkpoint stops a resume as it stops read_checkpoint, the files unchanged; whole, it resumes.
  flip(checkpoint.size() - 1);
  const std::string damaged = refused(t, resume);
  CHECK(damaged.find("checksum does not match") != std::string::npos);
  CHECK(testing::read_file(t.options.out_path) == adapter);
  flip(checkpoint.size() - 1);
  ::close(fd);
  CHECK(testing::read_file(t.checkpoint()) == checkpoint);
  CHECK(train::train_adapter(resume).epochs_resumed == 1);
}

}  // namespace
}  // namespace choreo
