#pragma once
// Calls files: the JSONL input of `choreo exec`, one engine call (or one batch of calls) per line.
// The whole file is parsed and validated before anything runs (unknown or forward references, duplicate ids,
// unknown fields, wrong types, obvious context overflow), so a bad file produces an error and no output.
// docs/exec.md is the format reference.

#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "runtime/engine/engine.h"
#include "runtime/model/llama.h"

namespace choreo::exec {

enum class CallOp { Prefill, Decode };

/// A parent as a call names it: the id of a call on an earlier line and an optional logical start position.
struct ParentRef {
  std::string ref;
  std::optional<int> offset;
};

/// One validated call of a calls file; its text is already tokenised (role affixes included).
struct Call {
  CallOp op = CallOp::Prefill;
  std::string id;
  SourceLocation where;  // the call's line (and column of its opening brace in a batch line)
  std::vector<ParentRef> parents;
  std::optional<int> new_offset;
  // Chat role wrapping ("" = none). `previous_role` is the role of the last listed parent, which decides the
  // turn affixes of formats that depend on the turn before (Llama 2).
  std::string role, previous_role;
  // A prefill: the message. A decode: the header (the turn prefix of `role` included).
  std::vector<model::Token> tokens;
  // Decode-only settings.
  model::SamplingParams sampling;
  int max_tokens = 256;
  std::optional<int> exact_tokens;
  std::vector<std::string> stop;
  int logprobs = 0;
  // Bookkeeping for the message store.
  std::string agent;
  kv::Visibility visibility = kv::Visibility::Public;
  int model = 0;  // the engine's model it runs on ("model": a name of the engine's model set)
  std::optional<RepairPolicy> repair;  // "repair": how it repairs parents read out of prefix (unset: none)
};

/// One input line: a single call, or a batch (a JSON list) of independent calls of one op run together.
struct CallLine {
  int line = 0;
  bool is_batch = false;
  std::vector<Call> calls;
};

/// A whole calls file after validation.
struct CallScript {
  std::string name;  // the file name used in error locations
  std::vector<CallLine> lines;
};

/// Settings a call takes when its line does not give them.
inline constexpr float kDefaultTemperature = 0.8f;
inline constexpr int kDefaultTopK = 40;
inline constexpr float kDefaultTopP = 0.95f;
inline constexpr int kDefaultMaxTokens = 256;
/// The seed of a decode without "seed": a hash of its id, so that calls differ and reruns agree.
uint64_t default_seed(std::string_view id);

/// Reads and validates every line of `in` (`name` is used in error locations). Tokenises with the base
/// model's vocabulary and chat template; a call's "model" names one of `models`; `mode` and `first_pos` (1
/// after an implicit BOS, else 0) drive the static context check. Throws InputError naming name:line[:col]
/// for the first bad line.
CallScript parse_calls(std::istream& in, const std::string& name, const runtime::ModelSet& models,
                       runtime::Mode mode, int first_pos);

/// Runs a validated script on `engine`, writing one JSON object per call and line to `out` (flushed after
/// every input line). Errors found only while running (context overflow after long generations, cache budget
/// spent) are rethrown as InputError naming the call's line; lines before it have been written.
void execute_calls(const CallScript& script, runtime::Engine& engine, std::ostream& out);

/// parse_calls then execute_calls: nothing runs unless the whole input is valid.
void run_calls(std::istream& in, const std::string& name, runtime::Engine& engine, std::ostream& out);

}  // namespace choreo::exec
