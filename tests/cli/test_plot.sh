#!/usr/bin/env bash
# scripts/akv-plot: every kind renders from JSON that akv wrote (tests/cli/plot_inputs, plus the
# format fixtures), the HTML report gathers them, and bad input is a one-line error with akv's
# exit codes and no output file. $1 (the akv binary) is not used.
source "$(dirname "$0")/lib.sh"
if ! "$PY" -c "import matplotlib" 2>/dev/null; then
  echo "skipped: matplotlib not installed for $PY (scripts/setup installs python3-matplotlib)"
  exit 77
fi
PLOT=("$PY" "$SRC/scripts/akv-plot")
IN="$SRC/tests/cli/plot_inputs"
FX="$SRC/data/fixtures"
o="$TMP/figs"
mkdir -p "$o"

is_png() { [[ $(head -c 8 "$1" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]]; }
plot_ok() {  # NAME OUT INPUT... : exit 0 and a PNG (or SVG) at OUT
  local name=$1 out=$2
  shift 2
  run "${PLOT[@]}" "$@" -o "$out"
  if [[ $rc -ne 0 ]]; then
    fail "$name: exit $rc; stderr: $(head -c 300 "$TMP/err")"
  elif [[ $out == *.png ]] && ! is_png "$out"; then
    fail "$name: $out is not a PNG"
  elif [[ $out == *.svg ]] && ! grep -q "<svg" "$out"; then
    fail "$name: $out is not an SVG"
  else
    pass "$name"
  fi
}

plot_ok "passkey grid" "$o/passkey.png" "$IN/passkey.json"
plot_ok "perplexity against bits (pareto)" "$o/ppl.png" "$IN/perplexity.json"
plot_ok "KL against bits (pareto --metric kl)" "$o/kl.svg" "$IN/perplexity.json" --metric kl
if grep -q "KL divergence" "$o/kl.svg"; then pass "the KL figure labels its axis"; else fail "the KL figure labels its axis"; fi
plot_ok "attention error against bits, two caches (pareto)" "$o/fid.svg" "$IN/fidelity.json" "$IN/fidelity.json"
plot_ok "attention error against bits, every method of evaluate --dump --methods (pareto)" "$o/fidm.svg" \
  "$IN/fidelity-methods.json"
if grep -q "adakv:budget=0.2" "$o/fidm.svg" && grep -q "ggml:k=q4_0" "$o/fidm.svg"; then
  pass "the methods figure labels each method's point"
else
  fail "the methods figure labels each method's point"
fi
plot_ok "decode attention against context" "$o/att.png" "$IN/bench-attention.json"
plot_ok "cache bytes per tier along the decode steps (tiers)" "$o/tiers.svg" "$IN/perplexity.json" --kind tiers
if grep -q "cold (host)" "$o/tiers.svg" && grep -q "compact:warm=64:cold-bits=16" "$o/tiers.svg"; then
  pass "tiers figure names the tiers and the tiered method"
else
  fail "tiers figure names the tiers and the tiered method"
fi
# Passkey accuracy and key log-probability against budget: one line per eviction method (its
# budget= variants), the other methods as bars; a file with no budget= method has no such figure.
# The same file's methods without budget= against their bits per element (the bits figure).
"$PY" - "$TMP/sweep.json" <<'PY'
import json, sys
methods = [("full", 1.0), ("kivi-2", 1.0), ("kivi-2:rotate=hadamard", 1.0)]
methods += [(f"snapkv:budget={b}", a) for b, a in ((0.1, 0.5), (0.3, 1.0), (0.5, 1.0))]
methods += [(f"streamingllm:budget={b}:sinks=8", a) for b, a in ((0.1, 0.0), (0.5, 0.5))]
json.dump({"format": "akv-passkey", "version": 1, "mode": "text", "trials": 2, "lengths": [1024], "depths": [0, 1],
           "methods": [{"method": m, "mean_accuracy": a, "accuracy": [[a], [a]], "mean_key_logprob": a - 1.01,
                        "bits_per_element": 32.0 if m == "full" else 3.9} for m, a in methods]},
          open(sys.argv[1], "w"))
PY
plot_ok "passkey accuracy against budget (budget)" "$o/sweep.svg" "$TMP/sweep.json" --kind budget
if grep -q "streamingllm:sinks=8" "$o/sweep.svg" && grep -q "kivi-2" "$o/sweep.svg"; then
  pass "budget figure: a line per eviction method, the quantizer as a bar"
else
  fail "budget figure: a line per eviction method, the quantizer as a bar"
fi
if grep -q "negative log-probability" "$o/sweep.svg"; then
  pass "budget figure: the key's log-probability panel"
else
  fail "budget figure: the key's log-probability panel"
fi
plot_ok "passkey against bits per element (bits)" "$o/bits.svg" "$TMP/sweep.json" --kind bits
if grep -q "kivi-2:rotate=hadamard" "$o/bits.svg" && grep -q "full" "$o/bits.svg" && ! grep -q "snapkv" "$o/bits.svg"; then
  pass "bits figure: the methods without budget=, rotated ones named"
else
  fail "bits figure: the methods without budget=, rotated ones named"
fi
# RULER: score against ratio, a line per base method of the sweep, methods without a ratio as
# horizontal lines; every method x task in the heatmap.
"$PY" - "$TMP/ruler.json" <<'PY'
import json, sys
rows = [("full", "full", None, 100.0), ("kivi-2", "kivi-2", None, 98.0)]
rows += [(f"snapkv:budget={1 - r:g}", "snapkv", r, 90 - 60 * r) for r in (0.25, 0.5, 0.875)]
rows += [(f"h2o:budget={1 - r:g}", "h2o", r, 70 - 60 * r) for r in (0.25, 0.5, 0.875)]
json.dump({"format": "akv-ruler", "version": 1, "tasks": ["niah_single_1", "vt"], "lengths": [4096, 8192], "samples": 2,
           "question": "decoded after compression",
           "methods": [{"method": m, "base": b, "ratio": r, "average": a, "score": [[a, a], [a, a]]} for m, b, r, a in rows]},
          open(sys.argv[1], "w"))
PY
plot_ok "ruler score against ratio (ruler)" "$o/ruler.svg" "$TMP/ruler.json"
if grep -q "h2o:budget=0.125" "$o/ruler.svg" && grep -q "niah_single_1" "$o/ruler.svg" && grep -q "kivi-2" "$o/ruler.svg"; then
  pass "ruler figure: the sweep's lines, the quantizer, every task"
else
  fail "ruler figure: the sweep's lines, the quantizer, every task"
fi
# A ruler run with --depths: one needle-depth x length heatmap per method (--kind niah); a run
# without depths is refused for that kind.
"$PY" - "$TMP/niah.json" <<'PY'
import json, sys
heat = lambda a: [[[a, a / 2], [a, 0.0], [a / 4, a]] for _ in range(2)]  # [task][depth][length]
json.dump({"format": "akv-ruler", "version": 1, "tasks": ["niah_single_1", "niah_multikey_2"], "lengths": [1024, 4096],
           "depths": [0, 0.5, 1], "samples": 1, "question": "decoded after compression",
           "methods": [{"method": m, "base": m, "ratio": None, "average": a, "score": [[a, a], [a, a]], "depth_score": heat(a)}
                       for m, a in (("full", 100.0), ("snapkv:budget=0.25", 40.0))]},
          open(sys.argv[1], "w"))
PY
plot_ok "needle depth x length heatmap (niah)" "$o/niah.svg" "$TMP/niah.json" --kind niah
if grep -q "snapkv:budget=0.25" "$o/niah.svg" && grep -q "needle depth" "$o/niah.svg"; then
  pass "niah figure: a panel per method, depth on the y axis"
else
  fail "niah figure: a panel per method, depth on the y axis"
fi
run "${PLOT[@]}" "$TMP/ruler.json" -o "$o/never.svg" --kind niah
if [[ $rc -eq 2 && ! -e $o/never.svg ]] && grep -q "depths" "$TMP/err"; then
  pass "--kind niah refuses a ruler run without depths (exit 2)"
else
  fail "--kind niah without depths: exit $rc"
fi
# A 30 x 30 grid: no accuracy written in each cell (900 labels took minutes at 300 x 300), at
# most 12 ticks per axis; the 3 x 3 grid above keeps its labels.
"$PY" - "$TMP/grid30.json" <<'PY'
import json, sys
n = 30
json.dump({"format": "akv-passkey", "version": 1, "trials": 1, "lengths": list(range(32, 32 + n)),
           "depths": [i / (n - 1) for i in range(n)],
           "methods": [{"method": "full", "mean_accuracy": 0.25, "accuracy": [[0.25] * n for _ in range(n)]}]},
          open(sys.argv[1], "w"))
PY
plot_ok "passkey grid of 30 x 30 cells" "$o/grid30.svg" "$TMP/grid30.json"
"${PLOT[@]}" "$IN/passkey.json" -o "$o/grid3.svg"
if ! grep -q "<!-- 0.25 -->" "$o/grid30.svg" && grep -Eq "<!-- [01]\.[0-9]{2} -->" "$o/grid3.svg"; then
  pass "cells labelled on a small grid only"
else
  fail "cells labelled on a small grid only"
fi
plot_ok "token budgets per head" "$o/budgets.png" "$FX/budgets.json"
plot_ok "joint plan per head" "$o/joint.png" "$FX/budgets-joint.json"
plot_ok "calibrated bits per head" "$o/calib.svg" "$FX/calibration.json" --kind heads
run "${PLOT[@]}" "$IN/perplexity.json" -o "$o/again.png"
if cmp -s "$o/ppl.png" "$o/again.png"; then pass "same input, same PNG bytes"; else fail "same input, same PNG bytes"; fi

cp "$IN"/*.json "$FX/budgets.json" "$FX/calibration.json" "$TMP/sweep.json" "$TMP/ruler.json" "$TMP/niah.json" "$TMP/figs/"
# A result of a known format with fields of the wrong type: listed as not plotted, not fatal.
printf '{"format": "akv-perplexity", "version": 1, "methods": 7}' >"$TMP/figs/zz-malformed.json"
run "${PLOT[@]}" report "$TMP/figs" -o "$TMP/report.html"
n=$(grep -o "<svg" "$TMP/report.html" | wc -l)
if [[ $rc -eq 0 && $n -eq 14 ]] && grep -q "Not plotted" "$TMP/report.html" && grep -q "synth.json" "$TMP/report.html" &&
   grep -q "zz-malformed.json: malformed" "$TMP/report.html" &&
   grep -q "perplexity.json: tiers" "$TMP/report.html" && grep -q "sweep.json: budget" "$TMP/report.html" && grep -q "sweep.json: bits" "$TMP/report.html" && grep -q "niah.json: needle depth" "$TMP/report.html" && grep -q "fidelity-methods.json" "$TMP/report.html" && ! grep -Eq "(src|href)=\"https?:" "$TMP/report.html"; then
  pass "report: 14 inline figures (tiers, budget, bits, ruler and its depth heatmap, the methods of one dump included), akv-synth and a malformed result listed as not plotted, no network"
else
  fail "report: exit $rc, $n figures; stderr: $(head -c 300 "$TMP/err")"
fi

# The page as a person sees it: headless Chromium takes a screenshot, which must not be blank.
if command -v chromium >/dev/null; then
  timeout 120 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1000,1400 \
    --screenshot="$TMP/shot.png" "file://$TMP/report.html" >/dev/null 2>&1
  if [[ -s $TMP/shot.png ]] && "$PY" - "$TMP/shot.png" <<'PY'; then
import sys
import matplotlib.image as image
px = image.imread(sys.argv[1])[..., :3]
dark = (px.mean(axis=2) < 0.5).mean()  # text, axes and heat maps on a white page
sys.exit(0 if px.std() > 0.05 and 0.01 < dark < 0.9 else 1)
PY
    pass "report screenshot in headless Chromium is not blank"
  else
    fail "report screenshot in headless Chromium is not blank"
  fi
else
  echo "skip report screenshot: chromium not installed (scripts/setup installs it)"
fi

# Bad input: one line, akv's exit codes, no output.
b="$TMP/bad"
mkdir -p "$b"
printf '{"format": "akv-passkey", "version": 1' >"$TMP/trunc.json"
printf '{"rows": []}' >"$TMP/noformat.json"
printf '{"format": "akv-perplexity", "version": 1, "methods": 7}' >"$TMP/methods.json"
printf '{"format": "akv-passkey", "version": 1, "methods": [{"accuracy": 3}], "lengths": [1], "depths": [0]}' >"$TMP/shape.json"
"$PY" - "$IN/perplexity.json" "$TMP/notrace.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
for m in doc["methods"]:
    del m["memory_trace"]
json.dump(doc, open(sys.argv[2], "w"))
PY
plot_err() {  # NAME CODE PATTERN ARGS...
  local name=$1 code=$2 pattern=$3
  shift 3
  run "${PLOT[@]}" "$@"
  if [[ $rc -ne $code ]]; then
    fail "$name: exit $rc, expected $code; stderr: $(head -c 300 "$TMP/err")"
  elif [[ $(wc -l <"$TMP/err") -ne 1 ]] || ! grep -Eq -- "^akv-plot: error: .*$pattern" "$TMP/err"; then
    fail "$name: stderr is not one 'akv-plot: error:' line matching /$pattern/: $(head -c 300 "$TMP/err")"
  else
    pass "$name"
  fi
}
plot_err "truncated JSON" 2 "not JSON .*trunc.json" "$TMP/trunc.json" -o "$b/x.png"
plot_err "JSON without a format" 2 "no format field" "$TMP/noformat.json" -o "$b/x.png"
plot_err "a format with no figure" 2 "format = akv-synth" "$IN/synth.json" -o "$b/x.png"
plot_err "passkey grid of the wrong shape" 2 "methods\[0\].accuracy" "$TMP/shape.json" -o "$b/x.png"
plot_err "tiers without a memory trace" 2 "no memory_trace .*methods\[\]" "$TMP/notrace.json" -o "$b/x.png" --kind tiers
plot_err "tiers of another format" 2 "--kind tiers does not fit" "$IN/passkey.json" -o "$b/x.png" --kind tiers
plot_err "budget figure without a budget= method" 2 "no method with a budget= flag" "$TMP/grid30.json" -o "$b/x.png" --kind budget
plot_err "bits figure of a passkey file without bits" 2 "bits_per_element" "$IN/passkey.json" -o "$b/x.png" --kind bits
plot_err "unknown kind" 2 "--kind = bars" "$IN/passkey.json" -o "$b/x.png" --kind bars
plot_err "kind that does not fit" 2 "--kind heads" "$IN/passkey.json" -o "$b/x.png" --kind heads
plot_err "two kinds in one figure" 1 "different kinds" "$IN/passkey.json" "$IN/perplexity.json" -o "$b/x.png"
plot_err "unknown metric" 1 "--metric = ppl" "$IN/perplexity.json" -o "$b/x.png" --metric ppl
plot_err "metric of another kind" 1 "--metric applies to pareto" "$IN/passkey.json" -o "$b/x.png" --metric kl
plot_err "unsupported output type" 1 "png or .svg" "$IN/passkey.json" -o "$b/x.jpg"
plot_err "missing input" 3 "cannot read .*nope.json" "$TMP/nope.json" -o "$b/x.png"
plot_err "missing output directory" 3 "output directory does not exist" "$IN/passkey.json" -o "$b/no/x.png"
plot_err "report of a directory without results" 2 "no akv result" report "$b" -o "$TMP/r.html"
plot_err "malformed result of a known format" 2 "malformed pareto result .*methods.json" "$TMP/methods.json" -o "$b/x.png"
cp "$IN/passkey.json" "$b/in.json"
plot_err "figure written over its input" 1 "output is an input file" "$b/in.json" -o "$b/in.json"
ln -s in.json "$b/link.svg"
plot_err "figure written over its input through a link" 1 "output is an input file" "$b/in.json" -o "$b/link.svg"
ln -s "$TMP/figs/passkey.json" "$b/r.html"
plot_err "report written over one of its JSON inputs (through a link)" 1 "output is an input file" report "$TMP/figs" -o "$b/r.html"
plot_err "report output that is not HTML" 1 "must end in .html" report "$TMP/figs" -o "$b/r.png"
cmp -s "$IN/passkey.json" "$b/in.json" && pass "the input survives" || fail "the input survives"
rm "$b/in.json" "$b/link.svg" "$b/r.html"
expect_empty_dir "no output after errors" "$b"
finish
