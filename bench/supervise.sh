#!/usr/bin/env bash
# Side-by-side benchmark of railgrid supervise against a raw pipe, s6, runit and supervisord.
#
#   bash bench/supervise.sh [MiB] [runs]
#
# 1. Log throughput: a child writes MiB (default 256) of 100-byte lines as fast as it can
#    (`yes LINE | head -c`), with a 64 MiB cap (rotation enforced) where the logger has one.
#    The producer times itself, so each figure is how fast the logger let it write.
# 2. Idle: resident memory (VmRSS) of the supervision processes while their child sleeps,
#    and their CPU time over 10 s.
# 3. Stop: SIGTERM to railgrid supervise until it exits, for children with 50 grandchildren,
#    one of which may ignore SIGTERM, and one that escaped the group (setsid) holding the
#    log pipe.
# Peers run when installed (Debian packages s6, runit, supervisor); missing ones are skipped.
# Needs root for s6/runit/supervisord scan dirs under /tmp; the railgrid child runs as nobody
# when root.
set -euo pipefail
cd "$(dirname "$0")/.."

MIB=${1:-256}
RUNS=${2:-3}
BYTES=$((MIB * 1024 * 1024))
CAP=$((64 * 1024 * 1024))
LINE=$(printf '%099d' 0)   # 99 characters + newline = 100-byte lines
IDLE_SECS=${IDLE_SECS:-10}
SECTIONS=${SECTIONS:-"throughput idle stop"}   # run a subset: SECTIONS=idle bash bench/supervise.sh
want() { case " $SECTIONS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# RG=/path/to/railgrid measures that binary instead of a fresh release build (to compare
# two builds on the same machine).
if [ -z "${RG:-}" ]; then
  cargo build --release --quiet
  RG=${CARGO_TARGET_DIR:-$PWD/target}/release/railgrid
fi
WORK=$(mktemp -d /tmp/railgrid-bench.XXXXXX)
chmod 755 "$WORK"
USER_FLAGS=()
[ "$(id -u)" = 0 ] && USER_FLAGS=(--user nobody)
pids_to_kill=()
cleanup() {
  for p in "${pids_to_kill[@]:-}"; do [ -n "$p" ] && kill -TERM "$p" 2>/dev/null || true; done
  sleep 0.5
  for p in "${pids_to_kill[@]:-}"; do [ -n "$p" ] && kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# The producer: writes BYTES of lines, then records its elapsed nanoseconds in $1.
producer() {
  local result=$1
  printf 'start=$(date +%%s%%N); yes %s | head -c %s; end=$(date +%%s%%N); echo $((end - start)) > %s' \
    "$LINE" "$BYTES" "$result"
}

wait_file() { # wait_file PATH SECONDS
  local deadline=$((SECONDS + $2))
  while [ ! -s "$1" ]; do
    [ $SECONDS -ge $deadline ] && { echo "timed out waiting for $1" >&2; return 1; }
    sleep 0.05
  done
}

mibs() { # mibs NANOSECONDS -> MiB/s
  awk -v n="$1" -v m="$MIB" 'BEGIN { printf "%.0f", m / (n / 1e9) }'
}

median() { sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

# --- throughput ---------------------------------------------------------------------------

run_raw() {
  local r=$WORK/raw.result; rm -f "$r"
  sh -c "$(producer "$r")" | cat > "$WORK/raw.out"
  cat "$r"; rm -f "$WORK/raw.out"
}

run_railgrid() {
  local d=$WORK/rg; rm -rf "$d"; mkdir -p "$d"; chmod 777 "$d"
  local r=$d/result
  "$RG" supervise --log "$d/child.log" --max-log-bytes "$CAP" --initial-backoff 1m "${USER_FLAGS[@]}" \
    -- /bin/sh -c "$(producer "$r"); exec sleep 1000" 2>/dev/null &
  local sup=$!; pids_to_kill+=("$sup")
  wait_file "$r" 300
  kill -TERM "$sup"; wait "$sup" || true
  cat "$r"
}

run_s6_log() {
  command -v s6-log >/dev/null || return 1
  local d=$WORK/s6log; rm -rf "$d"; mkdir -p "$d"
  sh -c "$(producer "$WORK/s6.result")" | s6-log n2 "s$CAP" "$d"
  cat "$WORK/s6.result"
}

run_svlogd() {
  command -v svlogd >/dev/null || return 1
  local d=$WORK/svlogd; rm -rf "$d"; mkdir -p "$d"
  printf 's%s\nn2\n' "$CAP" > "$d/config"
  sh -c "$(producer "$WORK/svlogd.result")" | svlogd "$d"
  cat "$WORK/svlogd.result"
}

# supervisord_conf DIR PROGRAM COMMAND: a foreground supervisord with one program.
supervisord_conf() {
  cat > "$1/supervisord.conf" <<CONF
[supervisord]
nodaemon=true
logfile=$1/supervisord.log
pidfile=$1/supervisord.pid
[program:$2]
command=$3
CONF
}

run_supervisord() {
  command -v supervisord >/dev/null || return 1
  local d=$WORK/sd; rm -rf "$d"; mkdir -p "$d"
  supervisord_conf "$d" producer "/bin/sh -c '$(producer "$d/result" | sed 's/%/%%/g'); exec sleep 1000'"
  cat >> "$d/supervisord.conf" <<CONF
stdout_logfile=$d/child.log
stdout_logfile_maxbytes=$CAP
stdout_logfile_backups=1
redirect_stderr=true
autorestart=false
CONF
  supervisord -c "$d/supervisord.conf" >/dev/null 2>&1 &
  local sd=$!; pids_to_kill+=("$sd")
  wait_file "$d/result" 600
  kill -TERM "$sd"; wait "$sd" || true
  cat "$d/result"
}

echo "# railgrid supervise benchmark: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(uname -sr)"
echo
if want throughput; then
echo "## Log throughput: ${MIB} MiB of 100-byte lines, ${RUNS} runs each, median"
echo
echo "| logger | MiB/s | ratio to raw pipe |"
echo "|---|---:|---:|"
# Runs are interleaved (raw, railgrid, peers, raw, railgrid, ...) so that every logger sees
# the same machine conditions; each figure is the median over the runs.
loggers=(raw railgrid s6_log svlogd supervisord)
declare -A results
for _ in $(seq "$RUNS"); do
  for name in "${loggers[@]}"; do
    if ns=$("run_$name" 2>/dev/null) && [ -n "$ns" ]; then
      results[$name]+="$ns "
    fi
  done
done
raw_ns=$(echo "${results[raw]}" | tr ' ' '\n' | grep . | median)
echo "| raw pipe (\`child \| cat > file\`) | $(mibs "$raw_ns") | 1.00 |"
for name in railgrid s6_log svlogd supervisord; do
  case $name in
    railgrid) label="railgrid supervise (64 MiB cap)" ;;
    s6_log) label="s6-log (64 MiB cap)" ;;
    svlogd) label="runit svlogd (64 MiB cap)" ;;
    supervisord) label="supervisord (64 MiB cap)" ;;
  esac
  if [ -n "${results[$name]:-}" ]; then
    ns=$(echo "${results[$name]}" | tr ' ' '\n' | grep . | median)
    ratio=$(awk -v a="$raw_ns" -v b="$ns" 'BEGIN { printf "%.2f", a / b }')
    echo "| $label | $(mibs "$ns") | $ratio |"
  else
    echo "| $label | not installed | — |"
  fi
done

fi

# --- idle ---------------------------------------------------------------------------------

rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
anon_kib() { awk '/^RssAnon:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
sum_anon() { local t=0; for p in "$@"; do t=$((t + $(anon_kib "$p"))); done; echo "$t"; }
cpu_ticks() { awk '{ i = index($0, ") "); split(substr($0, i + 2), f, " "); print f[12] + f[13] }' "/proc/$1/stat"; }
sum_rss() { local t=0; for p in "$@"; do t=$((t + $(rss_kib "$p"))); done; echo "$t"; }
sum_cpu() { local t=0; for p in "$@"; do t=$((t + $(cpu_ticks "$p"))); done; echo "$t"; }

idle_row() { # idle_row LABEL PID...
  local label=$1; shift
  local c0; c0=$(sum_cpu "$@")
  sleep "$IDLE_SECS"
  local c1; c1=$(sum_cpu "$@")
  local rss; rss=$(sum_rss "$@")
  local anon; anon=$(sum_anon "$@")
  local hz; hz=$(getconf CLK_TCK)
  printf '| %s | %s | %s | %.2f | %s |\n' "$label" "$(awk -v k="$rss" 'BEGIN { printf "%.1f", k / 1024 }')" \
    "$(awk -v k="$anon" 'BEGIN { printf "%.1f", k / 1024 }')" \
    "$(awk -v c=$((c1 - c0)) -v h="$hz" 'BEGIN { print c / h * 1000 }')" "$#"
}

children_of() { pgrep -P "$1" || true; }

if want idle; then
echo
echo "## Idle: child sleeping, supervision processes only, ${IDLE_SECS} s"
echo
echo "| supervisor | RSS MiB | of which anonymous MiB | CPU ms over ${IDLE_SECS} s | processes |"
echo "|---|---:|---:|---:|---:|"

"$RG" supervise --log "$WORK/idle.log" "${USER_FLAGS[@]}" -- /bin/sleep 100000 2>/dev/null &
rg=$!; pids_to_kill+=("$rg"); sleep 1
idle_row "railgrid supervise" "$rg"
kill -TERM "$rg"; wait "$rg" || true

if command -v s6-svscan >/dev/null; then
  sd=$WORK/s6scan; mkdir -p "$sd/svc/log" "$WORK/s6idlelog"
  printf '#!/bin/sh\nexec sleep 100000\n' > "$sd/svc/run"
  printf '#!/bin/sh\nexec s6-log n2 s%s %s\n' "$CAP" "$WORK/s6idlelog" > "$sd/svc/log/run"
  chmod +x "$sd/svc/run" "$sd/svc/log/run"
  s6-svscan "$sd" >/dev/null 2>&1 &
  scan=$!; pids_to_kill+=("$scan"); sleep 1
  procs=("$scan")
  for s in $(children_of "$scan"); do procs+=("$s"); done
  logger=$(pgrep -x s6-log -P "$(pgrep -f "s6-supervise svc/log" | head -1)" || true)
  [ -n "$logger" ] && procs+=("$logger")
  idle_row "s6 (s6-svscan, 2 × s6-supervise, s6-log)" "${procs[@]}"
  s6-svscanctl -t "$sd" 2>/dev/null || kill -TERM "$scan"; wait "$scan" 2>/dev/null || true
fi

if command -v runsv >/dev/null; then
  sv=$WORK/runit/svc; mkdir -p "$sv/log" "$WORK/runitlog"
  printf '#!/bin/sh\nexec sleep 100000\n' > "$sv/run"
  printf '#!/bin/sh\nexec svlogd %s\n' "$WORK/runitlog" > "$sv/log/run"
  chmod +x "$sv/run" "$sv/log/run"
  runsv "$sv" >/dev/null 2>&1 &
  rs=$!; pids_to_kill+=("$rs"); sleep 1
  procs=("$rs")
  for p in $(children_of "$rs"); do
    case "$(cat /proc/"$p"/comm)" in runsv|svlogd) procs+=("$p") ;; esac
    for q in $(children_of "$p"); do [ "$(cat /proc/"$q"/comm)" = svlogd ] && procs+=("$q"); done
  done
  idle_row "runit (runsv ×2, svlogd)" "${procs[@]}"
  kill -TERM "$rs"; pkill -TERM -f "runsv $sv" || true; wait "$rs" 2>/dev/null || true
fi

if command -v supervisord >/dev/null; then
  d=$WORK/sdidle; mkdir -p "$d"
  supervisord_conf "$d" sleeper "/bin/sleep 100000"
  cat >> "$d/supervisord.conf" <<CONF
stdout_logfile=$d/child.log
redirect_stderr=true
CONF
  supervisord -c "$d/supervisord.conf" >/dev/null 2>&1 &
  sdp=$!; pids_to_kill+=("$sdp"); sleep 2
  idle_row "supervisord" "$sdp"
  kill -TERM "$sdp"; wait "$sdp" 2>/dev/null || true
fi

fi

# --- stop ---------------------------------------------------------------------------------

stop_ms() { # stop_ms GRACE SCRIPT -> ms from SIGTERM to supervise's exit
  local log=$WORK/stop.log; rm -f "$log" "$log.1"
  "$RG" supervise --log "$log" --stop-grace "$1" "${USER_FLAGS[@]}" -- /bin/sh -c "$2" 2>/dev/null &
  local sup=$!
  local deadline=$((SECONDS + 30))
  until grep -q ready "$log" 2>/dev/null; do [ $SECONDS -ge $deadline ] && break; sleep 0.02; done
  sleep 0.2 # let the grandchildren reach their sleep
  local t0; t0=$(date +%s%N)
  kill -TERM "$sup"; wait "$sup" || true
  echo $((($(date +%s%N) - t0) / 1000000))
  # A child that escaped the group (it printed `escapee PID`) outlives the stop by design.
  for p in $(awk '$1 == "escapee" { print $2 }' "$log"); do kill -KILL "$p" 2>/dev/null || true; done
}

if want stop; then
FAN='for i in $(seq 50); do sleep 100000 & done; echo ready; wait'
IGNORER='for i in $(seq 50); do sleep 100000 & done; sh -c "trap \"\" TERM; exec sleep 100000" & echo ready; wait'
# Leaves the group with setsid and keeps the log pipe as its stdout.
ESCAPEE='setsid sh -c "echo escapee \$\$; exec sleep 100000" &'
echo
echo "## Stop: SIGTERM to railgrid supervise until it exits, child with 50 grandchildren, median of ${RUNS}"
echo
echo "| case | stop grace | ms |"
echo "|---|---:|---:|"
echo "| all exit on SIGTERM | 10s | $(for _ in $(seq "$RUNS"); do stop_ms 10s "$FAN"; done | median) |"
echo "| one grandchild ignores SIGTERM | 1s | $(for _ in $(seq "$RUNS"); do stop_ms 1s "$IGNORER"; done | median) |"
echo "| all exit on SIGTERM, one process escaped the group holding the log pipe | 10s | $(for _ in $(seq "$RUNS"); do stop_ms 10s "$ESCAPEE $FAN"; done | median) |"
echo "| one grandchild ignores SIGTERM, one process escaped the group holding the log pipe | 1s | $(for _ in $(seq "$RUNS"); do stop_ms 1s "$ESCAPEE $IGNORER"; done | median) |"
fi
