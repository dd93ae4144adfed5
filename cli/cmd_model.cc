// `choreo model info` and `choreo model synth`.

#include <tuple>
#include <cstdio>
#include <map>
#include <memory>

#include "cli/common.h"
#include "runtime/engine/open_engine.h"
#include "common/error.h"
#include "runtime/model/gguf.h"
#include "runtime/model/synth.h"
#include "runtime/model/synth_lora.h"

namespace choreo::cli {

namespace {

struct InfoOptions {
  std::string path;
  bool tensors = false;
};

void run_info(const InfoOptions& o) {
  gguf::File f = gguf::File::open(o.path);
  std::printf("file: %s\nformat: GGUF v%u, %.1f MiB, alignment %zu\n", f.path().c_str(), f.version(),
              f.file_size() / 1048576.0, f.alignment());
  std::printf("metadata (%zu keys):\n", f.metadata().size());
  for (const auto& [key, value] : f.metadata()) std::printf("  %-48s = %s\n", key.c_str(), value.to_string().c_str());
  std::map<std::string, std::pair<int, int64_t>> by_type;
  int64_t n_params = 0;
  for (const gguf::TensorInfo& t : f.tensors()) {
    auto& e = by_type[std::string(kernels::type_traits(t.type).name)];
    e.first += 1;
    e.second += t.n_elements();
    n_params += t.n_elements();
  }
  std::printf("tensors: %zu, %.2f M parameters\n", f.tensors().size(), n_params / 1e6);
  for (const auto& [type, e] : by_type) std::printf("  %-8s %5d tensors %12lld elements\n", type.c_str(), e.first, (long long)e.second);
  if (o.tensors) {
    for (const gguf::TensorInfo& t : f.tensors()) {
      std::string shape;
      for (size_t i = 0; i < t.shape.size(); ++i) shape += (i ? " x " : "") + std::to_string(t.shape[i]);
      std::printf("  %-40s %-6s [%s]\n", t.name.c_str(), std::string(kernels::type_traits(t.type).name).c_str(),
                  shape.c_str());
    }
  }
}

struct SynthOptions {
  std::string shape, type = "q8_0", out;
  uint64_t seed = 1;
};

void run_synth(const SynthOptions& o) {
  const model::SynthShape* shape = model::find_synth_shape(o.shape);
  if (!shape) {
    std::string names;
    for (const std::string& n : model::synth_shape_names()) names += (names.empty() ? "" : ", ") + n;
    throw InputError(fmt::format("unknown shape '{}'", o.shape), "known shapes: " + names);
  }
  model::write_synthetic_model(*shape, model::synth_weight_type(o.type), o.out, o.seed);
  std::fprintf(stderr, "wrote %s\n", o.out.c_str());
}

struct SynthLoraOptions {
  std::string model_path, layers, targets = "q,k,v,o,gate,up,down", out;
  model::SynthLoraSpec spec;
};

void run_synth_lora(SynthLoraOptions o) {
  if (!o.layers.empty()) std::tie(o.spec.first_layer, o.spec.end_layer) = model::parse_layer_range(o.layers, "--layers");
  o.spec.targets = model::parse_lora_targets(o.targets);
  runtime::ModelOptions options;
  options.path = o.model_path;
  options.backend = backend_choice().name;
  options.cuda_device = backend_choice().cuda_device;
  options.n_threads = 1;
  model::write_synthetic_lora(runtime::load_models(options)->model(), o.spec, o.out);
  std::fprintf(stderr, "wrote %s\n", o.out.c_str());
}

}  // namespace

void register_model(CLI::App& app) {
  CLI::App* model_cmd = app.add_subcommand("model", "inspect or synthesise GGUF models");
  model_cmd->require_subcommand(1);

  auto info = std::make_shared<InfoOptions>();
  CLI::App* info_cmd = model_cmd->add_subcommand("info", "print a GGUF file's metadata and tensor summary");
  info_cmd->add_option("model", info->path, "GGUF file")->required();
  info_cmd->add_flag("--tensors", info->tensors, "list every tensor");
  info_cmd->callback([info] { run_info(*info); });

  auto synth = std::make_shared<SynthOptions>();
  CLI::App* synth_cmd = model_cmd->add_subcommand(
      "synth", "write a random-weight llama GGUF of a real model's shape (for speed tests; see README.md)");
  synth_cmd->add_option("--shape", synth->shape, "model shape, e.g. smollm2-135m, llama-3.2-1b, llama-3.1-8b")->required();
  synth_cmd->add_option("--type", synth->type, "weight type: f32, f16, bf16, q8_0, q4_0, q4_1");
  synth_cmd->add_option("-o,--output", synth->out, "output file")->required();
  synth_cmd->add_option("--seed", synth->seed, "random seed");
  synth_cmd->callback([synth] { run_synth(*synth); });

  auto lora = std::make_shared<SynthLoraOptions>();
  CLI::App* lora_cmd = model_cmd->add_subcommand(
      "synth-lora", "write a random-weight LoRA adapter for a model, on chosen layers (for tests; docs/lora.md)");
  lora_cmd->add_option("-m,--model", lora->model_path, "the base model (default: the default model)");
  lora_cmd->add_option("--layers", lora->layers, "layers adapted: FIRST-LAST (inclusive) or one layer; default all");
  lora_cmd->add_option("--targets", lora->targets, "projections adapted: a subset of q,k,v,o,gate,up,down");
  lora_cmd->add_option("--rank", lora->spec.rank, "rank of every pair")->check(at_least(1));
  lora_cmd->add_option("--alpha", lora->spec.alpha, "adapter.lora.alpha (the scale is alpha / rank)");
  lora_cmd->add_option("--strength", lora->spec.strength, "standard deviation of B's entries (A's: 1/sqrt(n_in))");
  lora_cmd->add_option("--seed", lora->spec.seed, "random seed");
  lora_cmd->add_option("-o,--output", lora->out, "output file")->required();
  lora_cmd->callback([lora] { run_synth_lora(*lora); });
}

}  // namespace choreo::cli
