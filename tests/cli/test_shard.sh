#!/usr/bin/env bash
# Sharded evaluate --model: shards merged by `akv merge` give the unsharded report byte for byte
# (token files and --text chunks), scripts/run_sharded with GNU parallel does the same, and the
# merge refuses missing, duplicate and mismatched parts. Skipped when ../shared is absent.
source "$(dirname "$0")/lib.sh"
SHARED=${AKV_SHARED_DIR:-$SRC/../shared}
M="$SHARED/models/stories260K.bin"
T="$SHARED/data/stories260K-samples.txt"
if [[ ! -f $M ]]; then
  echo "skipped: $M not found"
  exit 77
fi
o="$TMP/out_dir"
mkdir -p "$o"
common=(--model "$M" --tokens "$T" --sequences 7 --methods kivi-2,adakv:budget=0.5:window=16,compact)
"$AKV" evaluate -q "${common[@]}" --json -o "$TMP/full.json"
for k in 1 2 3; do "$AKV" evaluate -q "${common[@]}" --shard "$k/3" -o "$TMP/p$k.json"; done
expect "a part names its format and shard" 0 '"shard": 2' cat "$TMP/p2.json"
expect "merge of the parts (in any order)" 0 "" "$AKV" merge "$TMP/p3.json" "$TMP/p1.json" "$TMP/p2.json" --json -o "$TMP/merged.json"
if cmp -s "$TMP/full.json" "$TMP/merged.json"; then pass "merged report equals the unsharded one byte for byte"
else fail "merged report equals the unsharded one byte for byte"; fi
# More shards than sequences: some shards are empty.
for k in 1 2 3 4 5 6 7 8 9; do "$AKV" evaluate -q "${common[@]}" --shard "$k/9" -o "$TMP/n$k.json"; done
"$AKV" merge "$TMP"/n?.json --json -o "$TMP/merged9.json"
if cmp -s "$TMP/full.json" "$TMP/merged9.json"; then pass "9 shards of 7 sequences merge to the same report"
else fail "9 shards of 7 sequences merge to the same report"; fi
# --text chunks shard the same way.
head -c 2000 "$SRC/README.md" >"$TMP/text.txt"
text=(--model "$M" --tokenizer bytes --text "$TMP/text.txt" --ctx 128 --methods kivi-4)
"$AKV" evaluate -q "${text[@]}" --json -o "$TMP/tfull.json"
for k in 1 2; do "$AKV" evaluate -q "${text[@]}" --shard "$k/2" -o "$TMP/t$k.json"; done
"$AKV" merge "$TMP/t1.json" "$TMP/t2.json" --json -o "$TMP/tmerged.json"
if cmp -s "$TMP/tfull.json" "$TMP/tmerged.json"; then pass "--text chunks: merged report equals the unsharded one"
else fail "--text chunks: merged report equals the unsharded one"; fi
# Passkey: prompts of the (depth, length, trial) grid; kivi-2 with a 32-token residual, so that
# the prompts hold quantized rows (the preset keeps 128 tokens in f16, more than these prompts have).
pk=(--model "$M" --tokens "$T" --task passkey --methods kivi-2:residual=32,streamingllm:budget=0.5:window=8 --lengths 32,64 --depths 0,0.5,1 --trials 3)
"$AKV" evaluate -q "${pk[@]}" --json -o "$TMP/kfull.json"
for k in 1 2 3; do "$AKV" evaluate -q "${pk[@]}" --shard "$k/3" -o "$TMP/k$k.json"; done
expect "a passkey part names its format" 0 '"format": "akv-passkey-part"' cat "$TMP/k1.json"
"$AKV" merge "$TMP/k2.json" "$TMP/k3.json" "$TMP/k1.json" --json -o "$TMP/kmerged.json"
if cmp -s "$TMP/kfull.json" "$TMP/kmerged.json"; then pass "passkey: merged report equals the unsharded one"
else fail "passkey: merged report equals the unsharded one"; fi
"$AKV" evaluate -q "${pk[@]/0,0.5,1/0,1,0.5}" --shard 2/3 -o "$TMP/kother.json"
# RULER (byte tokenizer on stories260K: the scores are plumbing, the shards must still merge).
ru=(--model "$M" --tokenizer bytes --task ruler --tasks niah_single_1,vt --lengths 420,500 --samples 2 --answer-tokens 6
    --methods streamingllm,kivi-2 --ratios 0.5)
"$AKV" evaluate -q "${ru[@]}" --json -o "$TMP/rfull.json"
for k in 1 2 3; do "$AKV" evaluate -q "${ru[@]}" --shard "$k/3" -o "$TMP/r$k.json"; done
expect "a ruler part names its format" 0 '"format": "akv-ruler-part"' cat "$TMP/r1.json"
"$AKV" merge "$TMP/r3.json" "$TMP/r1.json" "$TMP/r2.json" --json -o "$TMP/rmerged.json"
if cmp -s "$TMP/rfull.json" "$TMP/rmerged.json"; then pass "ruler: merged report equals the unsharded one"
else fail "ruler: merged report differs from the unsharded one"; fi
expect_error "merge: a ruler shard missing" 2 "shard missing" "$AKV" merge "$TMP/r1.json" "$TMP/r3.json" -o "$o/m.json"
# Counts that are not non-negative integers, the same in every part (so no part differs from the
# first): the error names the file, the field and the value.
"$PY" - "$TMP" <<'PY'
import json, sys
t = sys.argv[1]
for k in (1, 2, 3):
    j = json.load(open(f"{t}/r{k}.json"))
    json.dump(dict(j, samples=-1), open(f"{t}/rs{k}.json", "w"))
    json.dump(dict(j, shards=1.5), open(f"{t}/rn{k}.json", "w"))
PY
expect_error "merge: ruler samples of -1" 2 "rs1.json: samples = -1" "$AKV" merge "$TMP"/rs{1,2,3}.json -o "$o/m.json"
expect_error "merge: a shard count of 1.5" 2 "rn1.json: shards = 1.5" "$AKV" merge "$TMP"/rn{1,2,3}.json -o "$o/m.json"
# bench decode: methods per shard, each shard with its own full baseline.
dec=(--model "$M" --tokens "$T" --prefill 64 --sequences 2 --repeats 1 --methods kivi-4,kivi-2,compact)
"$AKV" bench decode "${dec[@]}" --json -o "$TMP/dfull.json"
for k in 1 2; do "$AKV" bench decode "${dec[@]}" --shard "$k/2" -o "$TMP/d$k.json"; done
"$AKV" merge "$TMP/d2.json" "$TMP/d1.json" --json -o "$TMP/dmerged.json"
expect "bench decode: merged rows are the unsharded run's plus one full per shard" 0 "decode ok" "$PY" - "$TMP" <<'PY'
import json, sys
t = sys.argv[1]
full, merged = json.load(open(f"{t}/dfull.json")), json.load(open(f"{t}/dmerged.json"))
rows = [(m["method"], m["cache_bytes"]) for m in full["methods"]]
got = [(m["method"], m["cache_bytes"], m["shard"]) for m in merged["methods"]]
assert got == [rows[0] + (1,), rows[1] + (1,), rows[0] + (2,), rows[2] + (2,), rows[3] + (2,)], got
assert merged["format"] == "akv-bench-decode" and len(merged["shard_prefill_tokens_per_s"]) == 2
assert all(m["time_per_token_vs_full"] == 1.0 for m in merged["methods"] if m["method"] == "full")
print("decode ok")
PY
# GNU parallel through scripts/run_sharded.
if command -v parallel >/dev/null; then
  expect "run_sharded with GNU parallel" 0 "" bash "$SRC/scripts/run_sharded" --akv "$AKV" -j 2 3 "$TMP/par.json" -- "${common[@]}" --json
  if cmp -s "$TMP/full.json" "$TMP/par.json"; then pass "run_sharded's report equals the unsharded one"
  else fail "run_sharded's report equals the unsharded one"; fi
  expect "run_sharded --slurm prints an array job and a dependent merge" 0 "dependency=afterok" \
    bash "$SRC/scripts/run_sharded" --akv "$AKV" --slurm 4 "$TMP/s.json" -- "${common[@]}"
else
  echo "skip run_sharded: GNU parallel not installed (scripts/setup installs it)"
fi
expect "run_sharded: a flag without its value is a usage error (exit 1), one line" 1 "^run_sharded: -j needs a value$" \
  bash "$SRC/scripts/run_sharded" -j
# Refusals: one line, exit 2, no output.
"$AKV" evaluate -q --model "$M" --tokens "$T" --sequences 6 --methods kivi-2,adakv:budget=0.5:window=16,compact \
  --shard 2/3 -o "$TMP/other.json"
cp "$M" "$TMP/m.bin"
"$AKV" evaluate -q --model "$TMP/m.bin" --tokens "$T" --sequences 7 --methods kivi-2 --shard 1/2 -o "$TMP/h1.json"
printf '\x3f' | dd of="$TMP/m.bin" bs=1 seek=$(($(stat -c %s "$TMP/m.bin") - 2)) conv=notrunc status=none
"$AKV" evaluate -q --model "$TMP/m.bin" --tokens "$T" --sequences 7 --methods kivi-2 --shard 2/2 -o "$TMP/h2.json"
expect_error "merge: the model changed between shards" 2 "part of another run: inputs" "$AKV" merge "$TMP/h1.json" "$TMP/h2.json" -o "$o/m.json"
expect_error "merge: a shard missing" 2 "shard missing .*shard = 3/3" "$AKV" merge "$TMP/p1.json" "$TMP/p2.json" -o "$o/m.json"
expect_error "merge: a shard twice" 2 "shard given twice" "$AKV" merge "$TMP/p1.json" "$TMP/p2.json" "$TMP/p2.json" "$TMP/p3.json" -o "$o/m.json"
expect_error "merge: a part of another run" 2 "part of another run: params" "$AKV" merge "$TMP/p1.json" "$TMP/other.json" "$TMP/p3.json" -o "$o/m.json"
expect_error "merge: parts of another shard count" 2 "different shard counts" "$AKV" merge "$TMP/p1.json" "$TMP/n2.json" -o "$o/m.json"
expect_error "merge: not a partial report" 2 "akv-perplexity-part" "$AKV" merge "$TMP/full.json" -o "$o/m.json"
expect_error "shard 0/3" 2 "--shard = 0/3" "$AKV" evaluate -q "${common[@]}" --shard 0/3 -o "$o/x.json"
expect_error "shard 4/3" 2 "--shard = 4/3" "$AKV" evaluate -q "${common[@]}" --shard 4/3 -o "$o/x.json"
expect_error "shard a/b" 2 "--shard = a/b" "$AKV" evaluate -q "${common[@]}" --shard a/b -o "$o/x.json"
expect_error "an empty shard (it wrote the full report)" 2 "empty shard" "$AKV" evaluate -q "${common[@]}" --shard '' -o "$o/x.json"
expect_error "--sequences -1 (it meant all)" 2 "sequences" "$AKV" evaluate -q "${common[@]}" --sequences -1 -o "$o/x.json"
"$AKV" --max-isa generic evaluate -q "${common[@]}" --shard 2/3 -o "$TMP/generic2.json"
expect_error "merge: a part computed with the plain loops (--max-isa generic)" 2 "part of another run: params" \
  "$AKV" merge "$TMP/p1.json" "$TMP/generic2.json" "$TMP/p3.json" -o "$o/m.json"
expect_error "merge: passkey parts of another grid" 2 "part of another run: depths" \
  "$AKV" merge "$TMP/k1.json" "$TMP/kother.json" "$TMP/k3.json" -o "$o/m.json"
# Tampered parts: fields other fields are indexed by, counts that would allocate, divide or wrap.
# Each starts from shard 1 made into a one-part run, which merges (the first check).
"$PY" - "$TMP" <<'PY'
import json, sys
d = sys.argv[1]
def one(name):
    j = json.load(open(f"{d}/{name}"))
    j["shards"] = 1
    return j
def w(name, j):
    json.dump(j, open(f"{d}/{name}", "w"))
p = one("p1.json")
p["total_sequences"] = len(p["sequences"])
w("t-ok.json", p)
cases = {
    "t-desc.json": lambda j: j.update(descriptions=j["descriptions"][:1]),
    "t-tokens0.json": lambda j: j["sequences"][0][1].update(tokens=0),
    "t-top1.json": lambda j: j["sequences"][0][1].update(top1=j["sequences"][0][1]["tokens"] + 1),
    "t-negative.json": lambda j: j["sequences"][0][1].update(bytes=-1),
    "t-total.json": lambda j: j.update(total_sequences="3"),
    "t-shards.json": lambda j: j.update(shards=2**63),
    "t-nofull.json": lambda j: j.update(specs=j["specs"][1:] + ["x"]),
    "t-float.json": lambda j: j.update(prompt_tokens=[1.5e129] * len(j["prompt_tokens"])),
    "t-tiers.json": lambda j: j["memory_traces"][3].update(hot=j["memory_traces"][3]["hot"][1:]),
    "t-noprompts.json": lambda j: j.pop("prompt_tokens"),
    "t-noshard.json": lambda j: j.pop("shard"),
}
for name, f in cases.items():
    j = json.loads(json.dumps(p)); f(j); w(name, j)
k = one("k1.json")
k.update(lengths=[32], depths=[0, 0.5], total_prompts=len(k["outcomes"]))
w("t-kok.json", k)
for name, f in {"t-kmode.json": lambda j: j.update(mode="audio"),
                "t-kgrid.json": lambda j: j.update(trials=2**62, lengths=[32] * 8),
                "t-kdesc.json": lambda j: j.update(descriptions=[]),
                "t-kagnostic.json": lambda j: j.update(query_agnostic="yes")}.items():
    j = json.loads(json.dumps(k)); f(j); w(name, j)
PY
expect "merge: a one-part run of tampered shape's base" 0 "" "$AKV" merge "$TMP/t-ok.json" -o "$TMP/t-ok.txt"
expect "merge: a one-part passkey run" 0 "" "$AKV" merge "$TMP/t-kok.json" -o "$TMP/t-kok.txt"
expect_error "merge: fewer descriptions than methods" 2 "one description per method .*descriptions = 1 entries" "$AKV" merge "$TMP/t-desc.json" -o "$o/m.json"
expect_error "merge: a sequence of 0 tokens" 2 "no predicted token .*tokens = 0" "$AKV" merge "$TMP/t-tokens0.json" -o "$o/m.json"
expect_error "merge: more top-1 hits than tokens" 2 "more top-1 hits than tokens" "$AKV" merge "$TMP/t-top1.json" -o "$o/m.json"
expect_error "merge: a negative count" 2 "not a non-negative integer .*bytes = -1" "$AKV" merge "$TMP/t-negative.json" -o "$o/m.json"
expect_error "merge: total_sequences as a string" 2 "total_sequences" "$AKV" merge "$TMP/t-total.json" -o "$o/m.json"
expect_error "merge: 2^63 shards claimed" 2 "shard missing .*shard = 2/9223372036854775808" "$AKV" merge "$TMP/t-shards.json" -o "$o/m.json"
expect_error "merge: a count written as a float past 2^64 (a cast of it was undefined)" 2 "non-negative integer is required" "$AKV" merge "$TMP/t-float.json" -o "$o/m.json"
expect_error "merge: a tiered trace's columns of different lengths" 2 "tier columns of different lengths .*warm = " "$AKV" merge "$TMP/t-tiers.json" -o "$o/m.json"
expect_error "merge: methods without the full cache first" 2 "start with the full cache" "$AKV" merge "$TMP/t-nofull.json" -o "$o/m.json"
expect_error "merge: an unknown passkey mode" 2 "unknown passkey mode .*mode = audio" "$AKV" merge "$TMP/t-kmode.json" -o "$o/m.json"
expect_error "merge: a passkey grid past 2^64 prompts" 2 "trials" "$AKV" merge "$TMP/t-kgrid.json" -o "$o/m.json"
expect_error "merge: passkey descriptions missing" 2 "one description per method" "$AKV" merge "$TMP/t-kdesc.json" -o "$o/m.json"
expect_error "merge: a part without its prompt lengths" 2 "partial report field missing or of the wrong type: .*'prompt_tokens' not found \\(.*t-noprompts.json\\)" \
  "$AKV" merge "$TMP/t-noprompts.json" -o "$o/m.json"
expect_error "merge: a part without its shard number" 2 "partial output field missing or of the wrong type: .*'shard' not found \\(.*t-noshard.json\\)" \
  "$AKV" merge "$TMP/t-noshard.json" -o "$o/m.json"
expect_error "merge: a passkey flag of another type" 2 "partial report field missing or of the wrong type: .*boolean.* \\(.*t-kagnostic.json\\)" \
  "$AKV" merge "$TMP/t-kagnostic.json" -o "$o/m.json"
expect_error "passkey lengths near 2^64 (wrapped the context check)" 2 "longer than .*--lengths = 18446744073709551615" \
  "$AKV" evaluate -q --model "$M" --tokens "$T" --task passkey --lengths 18446744073709551615 --depths 0 --trials 1 --methods kivi-2 -o "$o/x.json"
expect_empty_dir "no output after errors" "$o"
finish
