// `--backend`: the same command on the CPU backend and on the CUDA backend run by the block emulator
// (kernels/cuda/backend_core.h with the emulated device) prints the same greedy text; `--backend cuda` on a
// machine without a GPU (or a build without nvcc) is a clear error with exit 2, as is an unknown name; on a
// device of bounded memory, a T0 budget it cannot hold is a clear error with exit 2 before anything runs.

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/backend.h"
#include "tests/cli_process.h"
#include "tests/scratch_dir.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

namespace fs = std::filesystem;

TEST_CASE("backend choice: the emulated CUDA backend prints the CPU backend's greedy continuation") {
  const std::string binary = testing::choreo_binary();
  REQUIRE_MESSAGE(fs::exists(binary), "no choreo binary at ", binary, " (build it, or set CHOREO_BIN)");
  testing::ScratchDir scratch;
  const std::string model = testing::shared_file("models/stories260K.gguf");
  std::vector<std::string> outputs;
  for (const char* backend : {"cpu", "cuda-emulated"}) {
    CAPTURE(backend);
    const testing::ProcessResult r = testing::run_process(
        binary, {"generate", "-m", model, "-p", "Once upon a time", "-n", "24", "--temp", "0", "--backend", backend},
        scratch.path);
    CAPTURE(r.err);
    REQUIRE(r.exited);
    CHECK(r.exit_code == 0);
    outputs.push_back(r.out);
  }
  // shared/README.md's known greedy continuation, and the same bytes from both backends.
  CHECK(outputs[0].find(", there was a little girl named Lily.") != std::string::npos);
  CHECK(outputs[1] == outputs[0]);
}

TEST_CASE("backend choice: a KV budget the device cannot hold is refused before anything runs, one that fits runs") {
  // CHOREO_EMULATED_DEVICE_MIB gives the emulated device a GPU's bounded memory (docs/cuda.md).
  const std::string binary = testing::choreo_binary();
  testing::ScratchDir scratch;
  const std::string model = testing::shared_file("models/stories260K.gguf");
  testing::ProcessOptions device;
  device.env = {"CHOREO_EMULATED_DEVICE_MIB=8"};
  const std::vector<std::string> generate = {"generate", "-m", model, "-p", "Once upon a time", "-n", "24",
                                             "--temp", "0", "--backend", "cuda-emulated", "--cache-mib"};
  auto with_budget = [&](const char* mib) {
    std::vector<std::string> args = generate;
    args.push_back(mib);
    return args;
  };
  const testing::ProcessResult refused = testing::run_process(binary, with_budget("64"), scratch.path, device);
  CAPTURE(refused.err);
  REQUIRE(refused.exited);
  CHECK(refused.exit_code == 2);
  CHECK(refused.out.empty());  // refused at start-up: nothing generated
  CHECK(refused.err.find("64.0 MiB") != std::string::npos);  // the budget,
  CHECK(refused.err.find("MiB free") != std::string::npos);  // the device's free memory,
  CHECK(refused.err.find("--cache-mib") != std::string::npos);  // and the flag
  // The same budget on a device without the bound, and a budget that fits the bounded device: the greedy text
  // of the CPU backend (shared/README.md).
  const testing::ProcessResult unbounded = testing::run_process(binary, with_budget("64"), scratch.path);
  const testing::ProcessResult fits = testing::run_process(binary, with_budget("2"), scratch.path, device);
  for (const testing::ProcessResult* r : {&unbounded, &fits}) {
    CAPTURE(r->err);
    REQUIRE(r->exited);
    CHECK(r->exit_code == 0);
    CHECK(r->out.find(", there was a little girl named Lily.") != std::string::npos);
  }
  CHECK(fits.out == unbounded.out);
  // A knob that is not a number of MiB is a usage error too.
  device.env = {"CHOREO_EMULATED_DEVICE_MIB=lots"};
  const testing::ProcessResult bad = testing::run_process(binary, with_budget("2"), scratch.path, device);
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("CHOREO_EMULATED_DEVICE_MIB") != std::string::npos);
}

TEST_CASE("backend choice: no GPU, no CUDA build or an unknown name are errors with exit 2") {
  const std::string binary = testing::choreo_binary();
  testing::ScratchDir scratch;
  const std::string model = testing::shared_file("models/stories260K.gguf");
  std::vector<std::pair<std::vector<std::string>, std::string>> calls = {
      {{"generate", "-m", model, "-p", "hi", "--backend", "tpu"}, "--backend"},
      {{"generate", "-m", model, "-p", "hi", "--backend", "cuda", "--cuda-device", "-1"}, "--cuda-device"},
  };
  if (kernels::cuda_device_count() == 0)
    calls.push_back({{"generate", "-m", model, "-p", "hi", "--backend", "cuda"},
                     kernels::built_with_cuda() ? "no CUDA device" : "built without the CUDA backend"});
  for (const auto& [args, expected] : calls) {
    CAPTURE(args.back());
    const testing::ProcessResult r = testing::run_process(binary, args, scratch.path);
    CAPTURE(r.err);
    CHECK(r.exited);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(expected) != std::string::npos);
    CHECK(r.out.empty());
  }
  // The library says the same.
  CHECK_THROWS_AS(kernels::make_backend("tpu", 1), InputError);
  if (kernels::cuda_device_count() == 0) CHECK_THROWS_AS(kernels::make_backend("cuda", 1), InputError);
  CHECK(kernels::make_backend("cuda-emulated", 1)->name() == "cuda-emulated");
}

TEST_CASE("backend choice: cuBLASLt is not linked into choreo, and a CUDA build loads it with every function it calls") {
  // The half-gigabyte library would be mapped by every process (and stop choreo from starting under a tight
  // address-space limit): the CUDA device backend opens it when it makes its device.
  std::ifstream maps("/proc/self/maps");
  const std::string mapped((std::istreambuf_iterator<char>(maps)), std::istreambuf_iterator<char>());
  CHECK(mapped.find("libcublasLt") == std::string::npos);
  if (!kernels::built_with_cuda()) {
    CHECK_FALSE(kernels::load_cuda_blas());
    return;
  }
  CHECK(kernels::load_cuda_blas());  // dlopen and dlsym need no GPU
  CHECK(kernels::load_cuda_blas());  // once
}

}  // namespace
}  // namespace choreo
