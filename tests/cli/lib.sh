# Shared helpers for the CLI tests. Source after setting nothing; $1 of the script is the akv
# binary. Each check prints one line; finish prints "N passed, N failed" and sets the status.
set -u
AKV=${1:?usage: $0 PATH_TO_AKV}
PY=${AKV_PYTHON:-python3}
SRC=${AKV_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
passed=0
failed=0

pass() { passed=$((passed + 1)); echo "ok   $1"; }
fail() { failed=$((failed + 1)); echo "FAIL $1"; }
# expect_equal NAME GOT WANT
expect_equal() { if [[ $2 == "$3" ]]; then pass "$1"; else fail "$1: got '$2', want '$3'"; fi; }

# run CMD...: runs a command, keeping stdout in $TMP/out, stderr in $TMP/err, status in $rc.
run() {
  "$@" >"$TMP/out" 2>"$TMP/err"
  rc=$?
}

# expect_output NAME REGEX: the previous command's stdout holds REGEX (ERE); runs nothing.
expect_output() {
  if grep -Eq -- "$2" "$TMP/out"; then pass "$1"; else fail "$1: output lacks /$2/"; fi
}

# expect NAME CODE REGEX CMD...: exit status CODE and REGEX (ERE) found in stdout or stderr.
expect() {
  local name=$1 code=$2 pattern=$3
  shift 3
  run "$@"
  if [[ $rc -ne $code ]]; then
    fail "$name: exit $rc, expected $code; stderr: $(head -c 300 "$TMP/err")"
  elif [[ -n $pattern ]] && ! grep -Eq -- "$pattern" "$TMP/out" "$TMP/err"; then
    fail "$name: output lacks /$pattern/; stderr: $(head -c 300 "$TMP/err")"
  else
    pass "$name"
  fi
}

# expect_error NAME CODE REGEX CMD...: a failure with exactly one stderr line
# "akv: error: ..." matching REGEX, and nothing on stdout.
expect_error() {
  local name=$1 code=$2 pattern=$3
  shift 3
  run "$@"
  local lines
  lines=$(wc -l <"$TMP/err")
  if [[ $rc -ne $code ]]; then
    fail "$name: exit $rc, expected $code; stderr: $(head -c 300 "$TMP/err")"
  elif [[ $lines -ne 1 ]] || ! grep -Eq -- "^akv: error: .*$pattern" "$TMP/err"; then
    fail "$name: stderr is not one 'akv: error:' line matching /$pattern/: $(head -c 300 "$TMP/err")"
  elif [[ -s $TMP/out ]]; then
    fail "$name: stdout is not empty"
  else
    pass "$name"
  fi
}

# expect_no_output NAME DIR: DIR holds no file at all (neither target nor temporary).
expect_empty_dir() {
  if [[ -z $(ls -A "$2") ]]; then pass "$1"; else fail "$1: left $(ls -A "$2" | tr '\n' ' ')"; fi
}

# expect_cache_bytes CACHE: `akv info --json` byte counts per component equal the stored dataset
# sizes that h5py reads (tests/cli/cache_tool.py).
expect_cache_bytes() {
  local cache=$1 want got
  "$AKV" info --json "$cache" >"$TMP/info.json"
  want=$("$PY" "$SRC/tests/cli/cache_tool.py" bytes "$cache")
  got=$("$PY" -c "import json; b=json.load(open('$TMP/info.json'))['bytes']; print(json.dumps(b, sort_keys=True))")
  if [[ "$want" == "$got" ]]; then
    pass "bytes of $(basename "$cache") equal h5py storage sizes"
  else
    fail "bytes of $(basename "$cache"): akv $got, h5py $want"
  fi
}

need_python_h5py() {
  if ! "$PY" -c "import h5py, numpy" 2>/dev/null; then
    echo "SKIP: $PY cannot import h5py and numpy (scripts/setup installs python3-h5py)"
    exit 77
  fi
}

finish() {
  echo "$passed passed, $failed failed"
  [[ $failed -eq 0 ]]
}
