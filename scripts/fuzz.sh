#!/usr/bin/env bash
# Fuzzes the GGUF reader, then the other targets below (workflow YAML, expressions, PML, tokenizers), with
# libFuzzer + ASan + UBSan.
#   scripts/fuzz.sh [seconds=60]      (each target runs for that many seconds)
# Builds build-fuzz/ with clang (the whole library instrumented), seeds build-fuzz/gguf-corpus with the shared
# GGUF files and writer-made files, runs for the given time and exits non-zero on any crash, leak or timeout
# (the failing input is saved as build-fuzz/artifacts/crash-*; re-run it with build-fuzz/gguf_fuzz <file>).
set -euo pipefail

seconds="${1:-60}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
shared="${CHOREO_SHARED:-$root/../shared}"
build="$root/build-fuzz"
sanitizers="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"

CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja \
  -DCHOREO_FUZZ=ON -DCHOREO_TESTS=OFF -DCHOREO_WERROR=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="$sanitizers" -DCMAKE_C_FLAGS="$sanitizers" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" >/dev/null
ninja -C "$build" -j2 gguf_fuzz

corpus="$build/gguf-corpus"
artifacts="$build/artifacts"
mkdir -p "$corpus" "$artifacts"
if [[ -d "$shared/models" ]]; then
  find "$shared/models" -name '*.gguf' -exec cp -f {} "$corpus/" \;
else
  echo "fuzz.sh: $shared/models not found; seeding with writer-made files only" >&2
fi
# Writer-made seeds (every value type, alignments, vocab-only, tiny synthetic models).
if ! CHOREO_FUZZ_SEED_DIR="$corpus" "$build/gguf_fuzz" -runs=0 "$corpus" >"$build/seed.log" 2>&1; then
  cat "$build/seed.log" >&2
  echo "fuzz.sh: writing or replaying the seed corpus failed" >&2
  exit 1
fi

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

echo "fuzz.sh: fuzzing gguf_fuzz for ${seconds}s (corpus $corpus)"
"$build/gguf_fuzz" "$corpus" \
  -max_total_time="$seconds" -max_len=1048576 -rss_limit_mb=2048 -timeout=20 \
  -dict="$dict" -artifact_prefix="$artifacts/" -print_final_stats=1

# ---- the workflow parser (dsl/workflow_parser): seeds are the shipped workflows/*.yaml -------------------
ninja -C "$build" -j2 workflow_fuzz
workflow_corpus="$build/workflow-corpus"
mkdir -p "$workflow_corpus"
CHOREO_SOURCE_DIR="$root" CHOREO_FUZZ_SEED_DIR="$workflow_corpus" "$build/workflow_fuzz" -runs=0 "$workflow_corpus" \
  >"$build/workflow-seed.log" 2>&1 || { cat "$build/workflow-seed.log" >&2; exit 1; }
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
echo "fuzz.sh: fuzzing workflow_fuzz for ${seconds}s (corpus $workflow_corpus)"
"$build/workflow_fuzz" "$workflow_corpus" \
  -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -timeout=20 \
  -dict="$workflow_dict" -artifact_prefix="$artifacts/" -print_final_stats=1

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

echo "fuzz.sh: fuzzing expr_fuzz for ${seconds}s (corpus $expr_corpus)"
"$build/expr_fuzz" "$expr_corpus" \
  -max_total_time="$seconds" -max_len=4096 -rss_limit_mb=2048 -timeout=10 \
  -dict="$dict" -artifact_prefix="$artifacts/expr-" -print_final_stats=1

# ---- the PML parsers (dsl/pml): schemas and prompts; seeds are the shipped schemas/*.pml ------------------
ninja -C "$build" -j2 pml_fuzz
pml_corpus="$build/pml-corpus"
mkdir -p "$pml_corpus"
printf '%s' '<prompt schema="travel"><travel-plan duration="3 days"><overseas><tokyo/></overseas></travel-plan> Plan it &amp; list costs.<assistant/></prompt>' \
  >"$pml_corpus/seed_prompt"
CHOREO_SOURCE_DIR="$root" CHOREO_FUZZ_SEED_DIR="$pml_corpus" "$build/pml_fuzz" -runs=0 "$pml_corpus" \
  >"$build/pml-seed.log" 2>&1 || { cat "$build/pml-seed.log" >&2; exit 1; }
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
echo "fuzz.sh: fuzzing pml_fuzz for ${seconds}s (corpus $pml_corpus)"
(cd "$build" && "$build/pml_fuzz" "$pml_corpus" \
  -max_total_time="$seconds" -max_len=16384 -rss_limit_mb=2048 -timeout=10 \
  -dict="$pml_dict" -artifact_prefix="$artifacts/pml-" -print_final_stats=1)

# ---- the tokenizers (runtime/model/vocab*): SPM and four byte-level BPE pre-tokenizers; seeds are llama.cpp's
# tokenizer test texts in $shared/models/vocab/*.inp ----------------------------------------------------------
ninja -C "$build" -j2 tokenizer_fuzz
tokenizer_corpus="$build/tokenizer-corpus"
mkdir -p "$tokenizer_corpus"
CHOREO_SHARED="$shared" CHOREO_FUZZ_SEED_DIR="$tokenizer_corpus" "$build/tokenizer_fuzz" -runs=0 "$tokenizer_corpus" \
  >"$build/tokenizer-seed.log" 2>&1 || { cat "$build/tokenizer-seed.log" >&2; exit 1; }
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
echo "fuzz.sh: fuzzing tokenizer_fuzz for ${seconds}s (corpus $tokenizer_corpus)"
CHOREO_SHARED="$shared" "$build/tokenizer_fuzz" "$tokenizer_corpus" \
  -max_total_time="$seconds" -max_len=4096 -rss_limit_mb=2048 -timeout=20 \
  -dict="$tokenizer_dict" -artifact_prefix="$artifacts/tokenizer-" -print_final_stats=1
