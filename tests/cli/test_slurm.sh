#!/usr/bin/env bash
# Sharded evaluate on a real Slurm: a single-node cluster (munged, slurmctld, slurmd from Debian's
# packages, installed by scripts/setup) is started inside the test with its own configuration,
# scripts/run_sharded --slurm's submission script runs a 3-task job array and the dependent
# merge, and the merged report must equal the unsharded one byte for byte. Skipped when the
# daemons are not installed, when not root, or when ../shared is absent.
source "$(dirname "$0")/lib.sh"
SHARED=${AKV_SHARED_DIR:-$SRC/../shared}
M="$SHARED/models/stories260K.bin"
T="$SHARED/data/stories260K-samples.txt"
for b in munged munge slurmctld slurmd sbatch sinfo squeue; do
  command -v "$b" >/dev/null || PATH="$PATH:/usr/sbin"
  command -v "$b" >/dev/null || { echo "skipped: $b not installed (scripts/setup installs Slurm)"; exit 77; }
done
[[ $(id -u) -eq 0 ]] || { echo "skipped: starting slurmd needs root"; exit 77; }
[[ -f $M ]] || { echo "skipped: $M not found"; exit 77; }

S="$TMP/slurm"
mkdir -p "$S/state" "$S/spool"
host=$(hostname -s)
port=$((20000 + RANDOM % 20000))
cat >"$S/slurm.conf" <<EOF
ClusterName=akvtest
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd.pid
SlurmctldPort=$port
SlurmdPort=$((port + 1))
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=akvtest Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$S/slurm.conf"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  if [[ ! -s /etc/munge/munge.key ]]; then
    mkdir -p /etc/munge
    head -c 1024 /dev/urandom >/etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key 2>/dev/null || true
    chmod 400 /etc/munge/munge.key
  fi
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  munged --force --foreground >"$S/munged.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 20); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.25; done
fi
slurmctld -D -f "$SLURM_CONF" >"$S/slurmctld.log" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" >"$S/slurmd.log" 2>&1 &
pids+=($!)
ready=0
for _ in $(seq 1 60); do
  if sinfo -h -o %T 2>/dev/null | grep -q idle; then ready=1; break; fi
  sleep 0.5
done
if [[ $ready == 1 ]]; then pass "single-node Slurm cluster up"
else
  fail "single-node Slurm cluster up: $(tail -c 300 "$S/slurmctld.log") $(tail -c 300 "$S/slurmd.log")"
  finish
  exit
fi

# Inputs and output under a directory whose name holds every character the shells between
# run_sharded and akv could act on: a backtick, $( ), both quotes, a space, a newline.
H="$TMP/in \`touch pwned-tick\` \$(touch pwned-dollar) 'q\" \\"$'\n'"x"
mkdir -p "$H"
ln -s "$M" "$H/model.bin"
ln -s "$T" "$H/tokens.txt"
common=(--model "$H/model.bin" --tokens "$H/tokens.txt" --sequences 5 --methods kivi-2,compact)
"$AKV" evaluate -q "${common[@]}" --json -o "$TMP/full.json"
bash "$SRC/scripts/run_sharded" --akv "$AKV" --slurm 3 "$H/out.json" -- "${common[@]}" --json >"$TMP/submit.sh"
(cd "$S" && bash "$TMP/submit.sh" >"$S/submit.log" 2>&1)
expect "run_sharded --slurm's script submits the array and the merge" 0 "" test -s "$S/submit.log"
for _ in $(seq 1 240); do
  [[ -s $H/out.json ]] && [[ -z $(squeue -h 2>/dev/null) ]] && break
  sleep 0.5
done
if [[ -s $H/out.json ]] && cmp -s "$TMP/full.json" "$H/out.json"; then
  pass "Slurm job array + dependent merge, hostile paths: the unsharded report byte for byte"
else
  fail "Slurm job array + dependent merge: $(ls "$H" | tr '\n' ' ') $(cat "$S"/slurm-*.out 2>/dev/null | head -c 300)"
fi
pwned=$(find "$TMP" "$S" "$SRC" -maxdepth 2 -name 'pwned-*' 2>/dev/null)
expect "no command in a path ran inside the jobs or the submission script" 0 "" test -z "$pwned"
finish
