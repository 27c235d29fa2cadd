#!/usr/bin/env bash
# What a developer waits for after a one-line change in the hub, for each tree named (a
# git revision of this repository; default: the commit before the workspace and HEAD):
# a fresh checkout of it, built warm (`cargo build` and `cargo test --no-run`), then the
# help text of one hub metric changed, and timed:
# - `cargo build` (the binary again: what `hub serve` needs);
# - the same line changed again, `cargo test --no-run` (every build the change touches
#   for `cargo test`: the crates above it, their tests, the binary the tests drive).
# Each tree builds in a target directory of its own; nothing else should run meanwhile.
#
#   BENCH_TMP=/var/tmp bash bench/rebuild.sh [REV...]
set -euo pipefail
. "$(dirname "$0")/lib.sh"
REVS=("$@")
[ ${#REVS[@]} -gt 0 ] || REVS=(66a5c1c HEAD)
make_work rebuild
trap 'rm -rf "$WORK"' EXIT

# Seconds (wall) that the command takes.
seconds() {
  local t0 t1
  t0=$(date +%s.%N)
  "$@" >/dev/null 2>&1 || { echo "failed: $*" >&2; exit 1; }
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc
}

printf '%-10s %-34s %12s %18s\n' tree "file changed" "cargo build" "cargo test --no-run"
for rev in "${REVS[@]}"; do
  tree=$WORK/$rev
  git worktree add --quiet --detach "$tree" "$rev"
  (
    cd "$tree"
    export CARGO_TARGET_DIR=$tree/target
    cargo build --quiet
    cargo test --quiet --no-run
    file=crates/hub/src/metrics.rs
    [ -f "$file" ] || file=src/hub/metrics.rs
    # The one line: the help text of the hub's first counter.
    sed -i 's/Reconciles this hub answered\./Reconciles this hub answered (changed)./' "$file"
    grep -q '(changed)' "$file" || { echo "no line to change in $file" >&2; exit 1; }
    b=$(seconds cargo build)
    sed -i 's/(changed)/(changed again)/' "$file"
    t=$(seconds cargo test --no-run)
    printf '%-10s %-34s %11ss %17ss\n' "$(git rev-parse --short HEAD)" "$file" "$b" "$t"
  )
  git worktree remove --force "$tree"
done
