#!/usr/bin/env bash
# Fuzzes the GGUF reader, then the other targets below (workflow YAML, expressions, PML, tokenizers, exec calls
# files, eval data and results files, store entries, choreo.toml, LoRA adapters, finetune traces and checkpoints),
# with libFuzzer + ASan + UBSan.
#   scripts/fuzz.sh [seconds=60]      (each target runs for that many seconds)
# Builds build-fuzz/ with clang (the whole library instrumented; line tables only, which is all a sanitizer's stack
# trace needs and about a fifth less compile time than full debug information), seeds build-fuzz/gguf-corpus with the shared
# GGUF files and writer-made files, runs for the given time and exits non-zero on any crash, leak or timeout
# (the failing input is saved as build-fuzz/artifacts/TARGET-crash-*; re-run it with build-fuzz/TARGET <file>).
set -euo pipefail

seconds="${1:-60}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
shared="${CHOREO_SHARED:-$root/../shared}"
build="$root/build-fuzz"
sanitizers="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"

CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja \
  -DCHOREO_FUZZ=ON -DCHOREO_TESTS=OFF -DCHOREO_WERROR=OFF -DCHOREO_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="$sanitizers" -DCMAKE_C_FLAGS="$sanitizers" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" >/dev/null
artifacts="$build/artifacts"
mkdir -p "$artifacts"
# Every target first, so that one that no longer compiles fails the step before any fuzzing time is spent.
targets=()
for src in "$root"/tests/fuzz/*_fuzz.cc; do targets+=("$(basename "$src" .cc)"); done
ninja -C "$build" -j2 "${targets[@]}"

# fuzz_seed NAME CORPUS: builds target NAME and lets its start-up write seeds into CORPUS (CHOREO_FUZZ_SEED_DIR),
# then replays them; a failure prints the log and stops the script.
fuzz_seed() {
  ninja -C "$build" -j2 "$1"
  mkdir -p "$2"
  (cd "$build" && CHOREO_SOURCE_DIR="$root" CHOREO_SHARED="$shared" CHOREO_FUZZ_SEED_DIR="$2" "$build/$1" -runs=0 "$2") \
    >"$build/$1-seed.log" 2>&1 || { cat "$build/$1-seed.log" >&2; echo "fuzz.sh: seeding $1 failed" >&2; exit 1; }
}

# fuzz_run NAME CORPUS DICT MAX_LEN TIMEOUT: fuzzes target NAME for $seconds; a crash, leak or timeout
# stops the script (the input is saved as $artifacts/NAME-crash-*). Inputs that once failed
# (tests/fuzz/regressions/NAME/) join the corpus, so libFuzzer runs each of them before it mutates.
fuzz_run() {
  echo "fuzz.sh: fuzzing $1 for ${seconds}s (corpus $2)"
  if [[ -d "$root/tests/fuzz/regressions/$1" ]]; then cp -f "$root/tests/fuzz/regressions/$1"/* "$2/"; fi
  (cd "$build" && CHOREO_SOURCE_DIR="$root" CHOREO_SHARED="$shared" "$build/$1" "$2" \
    -max_total_time="$seconds" -max_len="$4" -rss_limit_mb=2048 -timeout="$5" \
    -dict="$3" -artifact_prefix="$artifacts/$1-" -print_final_stats=1)
}
corpus="$build/gguf-corpus"
mkdir -p "$corpus"
if [[ -d "$shared/models" ]]; then
  find "$shared/models" -name '*.gguf' -exec cp -f {} "$corpus/" \;
else
  echo "fuzz.sh: $shared/models not found; seeding with writer-made files only" >&2
fi
# Writer-made seeds (every value type, alignments, vocab-only, tiny synthetic models).
fuzz_seed gguf_fuzz "$corpus"

dict="$build/gguf.dict"
cat >"$dict" <<'DICT'
"GGUF"
"\x03\x00\x00\x00"
"\x02\x00\x00\x00"
"general.alignment"
"tokenizer.ggml.tokens"
"\x08\x00\x00\x00"
"\x09\x00\x00\x00"
"\xff\xff\xff\xff\xff\xff\xff\xff"
DICT

fuzz_run gguf_fuzz "$corpus" "$dict" 1048576 20

# ---- the workflow parser (dsl/workflow_parser): seeds are the shipped workflows/*.yaml -------------------
workflow_corpus="$build/workflow-corpus"
fuzz_seed workflow_fuzz "$workflow_corpus"
workflow_dict="$build/workflow.dict"
cat >"$workflow_dict" <<'DICT'
"name: "
"steps:"
"- decode: "
"- prefill: "
"- repeat: "
"parents: "
"{{"
"for: "
" in range("
"&a "
"*a"
"|\x0a"
DICT
fuzz_run workflow_fuzz "$workflow_corpus" "$workflow_dict" 65536 20

# ---- the expression language (dsl/expr): parse + evaluate + templates ------------------------------------
ninja -C "$build" -j2 expr_fuzz
expr_corpus="$build/expr-corpus"
mkdir -p "$expr_corpus"
# Seeds: one expression or template per file, covering the syntax and every library function.
i=0
while IFS= read -r seed; do
  printf '%s' "$seed" >"$expr_corpus/seed_$i"
  i=$((i + 1))
done <<'SEEDS'
answer[r-1][j] for j in range(agents) if j != i
[[i, j] for i in range(3) for j in range(i) if i + j > 1]
majority(votes) == 'yes' and not len(votes) < 2
'many' if agents > 2 else cfg.model + str(x * 2 ** 3 // 1 % 7)
regex_capture(r'answer: (\d+)', answer[0][0], 1) != null
regex_match(r'^\d+$', '123') or boxed(problem) in ['a']
json('{"a": [1, 2.5, null, true]}').a[-1:] + sorted([3, 1]) + split('a,b', ',')
join([strip(lower(upper(s))) for s in votes], ', ')[1:4]
int(' 42 ') + float('2.5') + sum([1, 2]) + min(1, 2) + max([3]) + index(votes, 'no')
any([true]) and all([v != '' for v in votes]) and {'k': [1]}['k'][0] == 1
Solve: {{ problem }} as Agent {{ i }}:\n{{{{ literal {{ votes }}
SEEDS

dict="$build/expr.dict"
cat >"$dict" <<'DICT'
"{{"
"}}"
" for "
" in "
" if "
" else "
" and "
" or "
"not "
"range("
"len("
"majority("
"regex_match("
"regex_capture("
"json("
"boxed("
"join("
"sorted("
"split("
"**"
"//"
"r'"
"\\boxed{"
DICT

fuzz_run expr_fuzz "$expr_corpus" "$dict" 4096 10

# ---- the PML parsers (dsl/pml): schemas and prompts; seeds are the shipped workflows/schemas/*.pml ------------------
pml_corpus="$build/pml-corpus"
mkdir -p "$pml_corpus"
printf '%s' '<prompt schema="travel"><travel-plan duration="3 days"><overseas><tokyo/></overseas></travel-plan> Plan it &amp; list costs.<assistant/></prompt>' \
  >"$pml_corpus/seed_prompt"
fuzz_seed pml_fuzz "$pml_corpus"
pml_dict="$build/pml.dict"
cat >"$pml_dict" <<'DICT'
"<schema name=\"s\">"
"</schema>"
"<module name=\"m\">"
"</module>"
"<union scaffold=\"m\">"
"</union>"
"<parameter name=\"p\" length=\"4\"/>"
"<prompt schema=\"s\">"
"</prompt>"
"<system>"
"</user>"
"<assistant/>"
"<!--"
"-->"
"&lt;"
"&amp;"
"&#x41;"
"cache=\"false\""
"src=\""
DICT
fuzz_run pml_fuzz "$pml_corpus" "$pml_dict" 16384 10

# ---- the tokenizers (runtime/model/vocab*): SPM and four byte-level BPE pre-tokenizers; seeds are llama.cpp's
# tokenizer test texts in $shared/models/vocab/*.inp ----------------------------------------------------------
tokenizer_corpus="$build/tokenizer-corpus"
fuzz_seed tokenizer_fuzz "$tokenizer_corpus"
tokenizer_dict="$build/tokenizer.dict"
cat >"$tokenizer_dict" <<'DICT'
"<s>"
"</s>"
"<|endoftext|>"
"<unk>"
"\xe2\x96\x81"
"\xf0\x9f\x9a\x80"
"'s"
"'ll"
"  \x0a"
"\xc3\xa9"
"\xe4\xb8\xad"
"123456"
DICT
fuzz_run tokenizer_fuzz "$tokenizer_corpus" "$tokenizer_dict" 4096 20

# ---- the calls files of `choreo exec` (runtime/exec/calls): JSONL parsing and validation against stories260K;
# seeds are the examples in docs/exec.md ---------------------------------------------------------------------
ninja -C "$build" -j2 exec_fuzz
exec_corpus="$build/exec-corpus"
mkdir -p "$exec_corpus"
grep -E '^\[?\{"op"' "$root/docs/exec.md" >"$exec_corpus/seed_docs" || true
exec_dict="$build/exec.dict"
cat >"$exec_dict" <<'DICT'
"{\"op\":\"prefill\","
"{\"op\":\"decode\","
"\"id\":"
"\"parents\":["
"{\"ref\":\"a\",\"offset\":"
"\"role\":\"user\""
"\"max_tokens\":"
"\"temperature\":"
"\"stop\":["
"\"tokens\":[1,2]"
"1e999"
DICT
fuzz_run exec_fuzz "$exec_corpus" "$exec_dict" 8192 20

# ---- the files choreo eval reads (runtime/eval/dataset, results): MATH, LongBench, MuSiQue, jsonl, results ------
eval_data_corpus="$build/eval-data-corpus"
fuzz_seed eval_data_fuzz "$eval_data_corpus"
eval_data_dict="$build/eval-data.dict"
cat >"$eval_data_dict" <<'DICT'
"\"problem\": "
"\"answer\": "
"\"solution\": \"\\boxed{"
"\"context\": "
"\"answers\": ["
"\"all_classes\": "
"\"ctxs\": [{\"title\": \"t\", \"text\": "
"\"question\": "
"\"unique_id\": "
"\"id\": "
"\"mode\": \"choreo\""
"\"score\": "
"1e999"
DICT
fuzz_run eval_data_fuzz "$eval_data_corpus" "$eval_data_dict" 8192 20

# ---- the persistent store's entry files (runtime/store/entry_format): raw bytes, and entries built from the
# input, encoded, then corrupted -------------------------------------------------------------------------------
ninja -C "$build" -j2 store_entry_fuzz
store_corpus="$build/store-entry-corpus"
mkdir -p "$store_corpus"
printf 'CHOREOKV\002\000\000\000' >"$store_corpus/seed_raw"
printf 'CHOREOKV\003\000\000\000' >"$store_corpus/seed_raw_v3"
printf '\001abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ' >"$store_corpus/seed_structured"
printf '\003abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ' >"$store_corpus/seed_signed"
store_dict="$build/store-entry.dict"
cat >"$store_dict" <<'DICT'
"CHOREOKV"
"\x01\x00\x00\x00"
"\x02\x00\x00\x00"
"\x03\x00\x00\x00"
"\xff\xff\xff\xff"
DICT
fuzz_run store_entry_fuzz "$store_corpus" "$store_dict" 4096 20

# ---- choreo.toml's [tiers] (runtime/kv/tier_config) ---------------------------------------------------------
tier_config_corpus="$build/tier-config-corpus"
fuzz_seed tier_config_fuzz "$tier_config_corpus"
tier_config_dict="$build/tier-config.dict"
cat >"$tier_config_dict" <<'DICT'
"[tiers]"
"cache_mib = "
"host_cache_mib = "
"disk_cache_mib = "
"evict = \"workflow\""
"redis = \""
"redis_best_effort = true"
"9223372036854775807"
"[[tiers]]"
"{"
"\"\"\""
DICT
fuzz_run tier_config_fuzz "$tier_config_corpus" "$tier_config_dict" 4096 20

# ---- choreo serve's request bodies (runtime/serve/api) --------------------------------------------------------
serve_corpus="$build/serve-request-corpus"
fuzz_seed serve_request_fuzz "$serve_corpus"
serve_dict="$build/serve-request.dict"
cat >"$serve_dict" <<'DICT'
"\"messages\""
"\"role\""
"\"content\""
"\"type\""
"\"text\""
"\"stop\""
"\"n\""
"\"cache_control\""
"\"ephemeral\""
"\"choreo\""
"\"item_reference\""
"\\u0000"
"1e999"
"[[[["
DICT
fuzz_run serve_request_fuzz "$serve_corpus" "$serve_dict" 65536 10

# ---- LoRA adapter files (runtime/model/lora), checked against stories260K and run ----------------------------
lora_corpus="$build/lora-corpus"
fuzz_seed lora_fuzz "$lora_corpus"
lora_dict="$build/lora.dict"
cat >"$lora_dict" <<'DICT'
"GGUF"
"general.type"
"adapter"
"adapter.type"
"lora"
"adapter.lora.alpha"
".lora_a"
".lora_b"
"blk.0.attn_q.weight"
"output.weight"
"token_embd.weight"
"\x00\x00\x00\x00\x00\x00\x00\x00"
DICT
fuzz_run lora_fuzz "$lora_corpus" "$lora_dict" 65536 20

# ---- the files `choreo finetune train` reads (runtime/train): traces files, teacher-forced on stories260K, and
# checkpoints -----------------------------------------------------------------------------------------------
finetune_corpus="$build/finetune-corpus"
fuzz_seed finetune_fuzz "$finetune_corpus"
finetune_dict="$build/finetune.dict"
cat >"$finetune_dict" <<'DICT'
"\"line\""
"\"inputs\""
"\"params\""
"\"max_steps\""
"\"calls\""
"\"name\""
"\"generated\""
"\"ans\""
"\"more\""
"GGUF"
"train.epochs_done"
DICT
fuzz_run finetune_fuzz "$finetune_corpus" "$finetune_dict" 65536 20
