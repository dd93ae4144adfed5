// choreo: run multi-agent LLM workflows without encoding the same text twice.
// Errors a user causes print once, here, and exit 2; environment failures exit 1.

#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>


#include <CLI/CLI.hpp>

#include "cli/common.h"
#include "common/error.h"
#include "common/input_file.h"

namespace {

/// Parses the command line and runs the chosen command; the exit code says how it ended: 0, 2 for bad usage or
/// input (the error rendered once, here), 1 for a failure at run time.
int parse_and_run(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  } catch (const choreo::InputError& e) {
    std::fputs(e.render().c_str(), stderr);
    return 2;
  } catch (const choreo::RuntimeFailure& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "choreo — LLM inference on a global KV cache of messages (Prompt Choreography), on the CPU (--backend).\n"
      "Workflows: run, check, profile (quality, reuse), eval; Prompt Cache: encode, cache. See README.md and "
      "docs/."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "choreo 0.1.0");
  // Options of every command (docs/limits.md); they may be given after the subcommand too.
  app.fallthrough();
  std::vector<std::string> allowed_dirs;
  uint64_t max_input_mib = 0;
  app.add_option("--allow-path", allowed_dirs,
                 "also let files named inside other files (PML src=, a workflow's pml:, model: and models: files, "
                 "adapters and plans) be read from this directory (repeatable)")
      ->type_name("DIR");
  app.add_option("--max-input-mib", max_input_mib,
                 "size limit of every input file and JSON line, in MiB (default 256; workflows 4)")
      ->check(CLI::Range(uint64_t(1), uint64_t(1) << 24));
  choreo::cli::BackendChoice backend;
  choreo::cli::add_backend_options(app, backend);
  app.parse_complete_callback([&] {
    choreo::configure_input_policy(max_input_mib, allowed_dirs);
    choreo::cli::set_backend_choice(backend);
  });
  choreo::cli::register_generate(app);
  choreo::cli::register_tokenize(app);
  choreo::cli::register_model(app);
  choreo::cli::register_bench(app);
  choreo::cli::register_exec(app);
  choreo::cli::register_run(app);
  choreo::cli::register_encode(app);
  choreo::cli::register_profile(app);
  choreo::cli::register_check(app);
  choreo::cli::register_eval(app);
  choreo::cli::register_cache(app);
  choreo::cli::register_serve(app);
  choreo::cli::register_finetune(app);
  return parse_and_run(app, argc, argv);
}
