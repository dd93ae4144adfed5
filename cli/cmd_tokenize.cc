// `choreo tokenize`: text to token ids with the model's tokenizer.

#include <cstdio>

#include "cli/common.h"
#include "runtime/model/gguf.h"
#include "common/paths.h"
#include "runtime/model/vocab.h"

namespace choreo::cli {

namespace {

struct TokenizeOptions {
  std::string model_path, prompt;
  bool ids = false, no_bos = false, no_special = false;
};

void run_tokenize(const TokenizeOptions& o) {
  // Only the vocabulary is needed: no weights are validated, so vocab-only GGUF files work too.
  gguf::File file = gguf::File::open(o.model_path.empty() ? default_model_path() : o.model_path);
  model::Vocab vocab = model::Vocab::from_gguf(file);
  std::vector<model::Token> tokens = vocab.tokenize(o.prompt, !o.no_bos, !o.no_special);
  if (o.ids) {
    std::string out = "[";
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? ", " : "") + std::to_string(tokens[i]);
    std::printf("%s]\n", out.c_str());
    return;
  }
  for (model::Token t : tokens) {
    std::printf("%6d -> '%s'\n", t, vocab.token_to_piece(t, true).c_str());
  }
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand("tokenize", "print the tokens of a text");
  cmd->add_option("-m,--model", o->model_path, "GGUF model or vocab file (default: the default model)");
  cmd->add_option("-p,--prompt", o->prompt, "text to tokenize")->required();
  cmd->add_flag("--ids", o->ids, "print only the ids, as a list: [1, 403, 407]");
  cmd->add_flag("--no-bos", o->no_bos, "do not add BOS");
  cmd->add_flag("--no-parse-special", o->no_special, "treat special-token text as plain text");
  cmd->callback([o] { run_tokenize(*o); });
}

}  // namespace choreo::cli
