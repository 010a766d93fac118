#!/usr/bin/env bash
# One harness as a test: every file of regressions/NAME runs once (a past finding stays fixed),
# then NAME fuzzes for SECONDS from a copy of its seed corpus (the committed seeds stay as they
# are). A finding fails the test and leaves the input under WORK/NAME/artifacts/.
# Usage: run_harness.sh HARNESS_BINARY FUZZ_SOURCE_DIR NAME SECONDS WORK
set -euo pipefail
bin=$1 src=$2 name=$3 seconds=$4 work=$5/$3
rm -rf "$work"
mkdir -p "$work/corpus" "$work/artifacts"
export TMPDIR=$work
opts=(-rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=30 -max_len=16384
      -artifact_prefix="$work/artifacts/")
shopt -s nullglob
regressions=("$src/regressions/$name"/*)
if ((${#regressions[@]})); then
  if ! "$bin" "${opts[@]}" "${regressions[@]}" >"$work/regressions.log" 2>&1; then
    tail -n 40 "$work/regressions.log"
    echo "fuzz $name: a regression input fails again (log: $work/regressions.log)" >&2
    exit 1
  fi
fi
cp "$src/corpus/$name"/* "$work/corpus/"
if ! "$bin" "${opts[@]}" -max_total_time="$seconds" -print_final_stats=1 "$work/corpus" \
    >"$work/fuzz.log" 2>&1; then
  tail -n 60 "$work/fuzz.log"
  echo "fuzz $name: finding saved under $work/artifacts/" >&2
  exit 1
fi
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/fuzz.log")
rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/fuzz.log")
cov=$(grep -o 'cov: [0-9]*' "$work/fuzz.log" | tail -n 1)
echo "fuzz $name: ${#regressions[@]} regressions pass; ${seconds} s, $execs runs ($rate/s), $cov, no finding"
