// `choreo serve`: one long-lived engine behind the OpenAI and Anthropic HTTP APIs (docs/serve.md). The command
// opens the engine, names its models, binds the address, prints one line saying where it listens, and serves
// until SIGINT or SIGTERM.

#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "cli/common.h"
#include "cli/engine_flags.h"
#include "cli/serve_workflows.h"
#include "common/error.h"
#include "runtime/serve/server.h"

namespace choreo::cli {

namespace {

struct ServeFlags {
  EngineFlags engine;
  std::vector<std::string> lora_modules, model_files;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key, api_key_file;
  int max_concurrency = 64;
  int max_body_mib = 16;
  int timeout_s = 600;
  int header_timeout_s = 10;
  bool metrics = false;
  bool quiet = false;
  int max_pin_mib = -1;  // -1: a quarter of --cache-mib
  int max_pin_s = 600;
  std::string workflows_dir;
  std::vector<std::string> workflow_params;
  int workflow_timeout_s = -1;  // -1: --timeout
};

/// The id /v1/models lists for each model: the base model's file name without .gguf, then the named ones.
std::vector<std::string> model_ids(const runtime::ModelSet& set, const model::Model& base) {
  std::vector<std::string> ids{std::filesystem::path(base.file().path()).stem().string()};
  for (size_t i = 1; i < set.size(); ++i) ids.push_back(set[i].name);
  return ids;
}

/// The key clients must send: --api-key-file's first line, else --api-key (which other users of the machine can
/// read in the process list: said at start-up), else $CHOREO_API_KEY.
std::string api_key(const ServeFlags& o) {
  if (!o.api_key_file.empty()) {
    // Only the first line is read, and at most 4 KiB of it: --api-key-file /dev/zero or a large file is an error,
    // not a read of all of it.
    constexpr size_t kMaxKeyBytes = 4096;
    std::ifstream in(o.api_key_file, std::ios::binary);
    std::string head(kMaxKeyBytes + 1, '\0');
    if (in) in.read(head.data(), std::streamsize(head.size()));
    if (!in.is_open() || in.bad())
      throw InputError(fmt::format("--api-key-file {}: cannot read it", o.api_key_file),
                       "give a file whose first line is the key");
    head.resize(size_t(in.gcount()));
    const size_t eol = head.find('\n');
    if (eol == std::string::npos && head.size() > kMaxKeyBytes)
      throw InputError(fmt::format("--api-key-file {}: its first line is longer than {} bytes", o.api_key_file,
                                   kMaxKeyBytes),
                       "write the key alone on the file's first line");
    std::string key = head.substr(0, eol);
    while (!key.empty() && (key.back() == '\r' || key.back() == ' ' || key.back() == '\t')) key.pop_back();
    if (key.empty())
      throw InputError(fmt::format("--api-key-file {}: its first line is empty", o.api_key_file),
                       "write the key on the file's first line");
    return key;
  }
  if (!o.api_key.empty()) {
    std::fprintf(stderr, "warning: --api-key puts the key in the process list (/proc/PID/cmdline), where other "
                         "users of this machine can read it; use --api-key-file FILE or $CHOREO_API_KEY\n");
    return o.api_key;
  }
  const char* env = std::getenv("CHOREO_API_KEY");
  return env ? env : "";
}

void run_serve(const ServeFlags& o) {
  // SIGINT and SIGTERM go to one thread that stops the server; every thread started from here inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  serve::ServeOptions options;
  options.api_key = api_key(o);
  options.max_concurrency = o.max_concurrency;
  options.metrics = o.metrics;
  options.log_requests = !o.quiet;
  options.extensions.pins.max_bytes = size_t(o.max_pin_mib >= 0 ? o.max_pin_mib : o.engine.cache_mib / 4) << 20;
  options.extensions.pins.max_lease = std::chrono::seconds(o.max_pin_s);

  runtime::ModelOptions models = o.engine.model_options();
  models.add_models = [&o](const model::Model& base, runtime::ModelSet& set, runtime::ExtraModels& extra) {
    add_named_models(o.lora_modules, o.model_files, base, set, extra);
  };
  std::unique_ptr<runtime::OpenedEngine> opened =
      runtime::open_engine(models, o.engine.engine_options(runtime::Mode::Choreo, StorePolicy::Explicit));
  if (!o.workflows_dir.empty())
    options.workflows = served_workflows(o.workflows_dir, o.engine, opened->model().file().path(), o.workflow_params);
  options.workflow_timeout = std::chrono::seconds(o.workflow_timeout_s >= 0 ? o.workflow_timeout_s : o.timeout_s);
  std::vector<std::string> ids = model_ids(opened->engine().models(), opened->model());
  const size_t t0_mib = opened->pool().budget_bytes() >> 20;
  serve::Server server(std::move(opened), ids, options);

  serve::HttpLimits limits;
  limits.max_body_bytes = uint64_t(o.max_body_mib) << 20;
  limits.timeout = limits.idle = std::chrono::seconds(o.timeout_s);
  limits.header_timeout = std::chrono::seconds(o.header_timeout_s);
  serve::HttpServer http(o.host, o.port, limits,
                         [&server](const serve::HttpRequest& r, serve::HttpResponder& w) { server.handle(r, w); });
  std::string listed;
  for (const std::string& id : ids) listed += (listed.empty() ? "" : ", ") + id;
  std::printf("choreo serve: listening on http://%s:%d; models: %s; T0 %zu MiB; API key %s\n", o.host.c_str(),
              http.port(), listed.c_str(), t0_mib, options.api_key.empty() ? "not required" : "required");
  std::fflush(stdout);
  if (options.api_key.empty() && o.host != "127.0.0.1" && o.host != "::1")
    std::fprintf(stderr, "warning: serving on %s without an API key: anyone who can reach it can use it "
                         "(--api-key or $CHOREO_API_KEY)\n", o.host.c_str());

  std::thread stopper([&http, stop_signals] {
    int signal = 0;
    sigwait(&stop_signals, &signal);
    std::fprintf(stderr, "choreo serve: stopping (signal %d)\n", signal);
    http.stop();
  });
  http.run();
  stopper.detach();  // still waiting when run() ended for another reason; the process is ending
}

}  // namespace

void register_serve(CLI::App& app) {
  auto o = std::make_shared<ServeFlags>();
  CLI::App* cmd = app.add_subcommand(
      "serve", "serve the model over the OpenAI and Anthropic HTTP APIs, with a prefix cache and choreo's message "
               "extensions (see docs/serve.md)");
  cmd->add_option("--host", o->host, "address to listen on (default 127.0.0.1: this machine only)");
  cmd->add_option("--port", o->port, "port to listen on (0: any free port, printed at start)")->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key-file", o->api_key_file,
                  "a file whose first line is the key clients must send (Authorization: Bearer KEY or x-api-key)");
  cmd->add_option("--api-key", o->api_key,
                  "the key itself (visible to other users in the process list: prefer --api-key-file or "
                  "$CHOREO_API_KEY); default none");
  cmd->add_option("--max-concurrency", o->max_concurrency, "generations in flight at once; more are answered 429")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--max-body-mib", o->max_body_mib, "largest request body, MiB; larger ones are answered 413")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--timeout", o->timeout_s,
                  "seconds a client has to send a request's body, and to take each part of an answer; idle "
                  "connections close after it too (and sooner when the server needs their room)")
      ->check(CLI::Range(1, 86400));
  cmd->add_option("--header-timeout", o->header_timeout_s,
                  "seconds a client has to send a request's header once its first byte came (else the connection is closed); default 10")
      ->check(CLI::Range(1, 3600));
  cmd->add_flag("--metrics", o->metrics, "serve GET /metrics (Prometheus text format)");
  cmd->add_option("--workflows", o->workflows_dir,
                  "run the workflows of this directory (NAME.yaml) at POST /choreo/v1/workflows/NAME, answering "
                  "with what choreo run prints and its --json record");
  cmd->add_option("--workflow-params", o->workflow_params,
                  "params of those workflows that a request may set (comma-separated; default none: a request "
                  "sets inputs only)")
      ->delimiter(',');
  cmd->add_option("--workflow-timeout", o->workflow_timeout_s,
                  "seconds a workflow run may take; it is stopped past them (default: --timeout)")
      ->check(CLI::Range(1, 86400));
  cmd->add_option("--max-pin-mib", o->max_pin_mib,
                  "T0 MiB that messages pinned by choreo.retention may hold at once; pins past it are refused "
                  "(default: a quarter of --cache-mib)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--max-pin-s", o->max_pin_s,
                  "longest a pin lasts after the last request that read its message (a retention ttl may ask "
                  "for less; default 600)")
      ->check(CLI::Range(1, 86400));
  cmd->add_flag("-q,--quiet", o->quiet, "no line per request on stderr");
  add_named_model_flags(*cmd, o->lora_modules, o->model_files, "a request's \"model\":");
  o->engine.add(*cmd, EngineFlags::kModel | EngineFlags::kLora | EngineFlags::kKv | EngineFlags::kCache |
                          EngineFlags::kTiers | EngineFlags::kRedis | EngineFlags::kStore);
  cmd->callback([o] {
    o->engine.resolve();
    run_serve(*o);
  });
}

}  // namespace choreo::cli
