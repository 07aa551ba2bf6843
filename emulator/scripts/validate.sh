#!/usr/bin/env bash
# Runs the built-in oslat probe and the real oslat (Debian rt-tests) on the same CPU: idle, and
# under the same `qpw-emu load` in queue and in remote mode. Each condition runs the two tools
# alternately, twice each, so that the spread between two runs of one tool can be compared with
# the difference between the tools. Results go to $OUT (default ./results/validation); the
# summary table is `qpw-emu report` over all of them. See docs/validation.md.
#
#   apt-get install -y rt-tests            # the real oslat
#   cargo build --release -p qpw-emulator
#   bash emulator/scripts/validate.sh
set -euo pipefail
EMU=${QPW_EMU:-${CARGO_TARGET_DIR:-target}/release/qpw-emu}
OUT=${OUT:-results/validation}
CPU=${CPU:-$(( $(nproc) - 1 ))}
SECS=${SECS:-5}
WORKLOAD=${WORKLOAD:-lru}
command -v oslat >/dev/null || { echo "oslat not found: apt-get install -y rt-tests" >&2; exit 1; }
mkdir -p "$OUT"

pair() { # $1: condition name
  for run in a b; do
    oslat -c "$CPU" -D "$SECS" -b 1000 -q --json="$OUT/real-$1-$run.json" > "$OUT/real-$1-$run.txt"
    "$EMU" oslat -c "$CPU" -D "$SECS" -b 1000 -q --json "$OUT/emu-$1-$run.json" > "$OUT/emu-$1-$run.txt"
  done
}

pair idle
for mode in queue remote; do
  # The load leaves $CPU free of its threads (but for its worker in queue mode) and forces its
  # drains to reach it; it runs a little longer than the four probe runs.
  "$EMU" load -D $(( 4 * SECS + 12 ))s --free "$CPU" --mode "$mode" --workload "$WORKLOAD" -q \
    --json "$OUT/load-$mode.json" > "$OUT/load-$mode.txt" &
  load=$!
  sleep 1
  pair "$mode"
  wait "$load"
done
"$EMU" report "$OUT"/real-*.json "$OUT"/emu-*.json --out "$OUT"
cat "$OUT"/load-*.txt
