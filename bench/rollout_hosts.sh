#!/usr/bin/env bash
# Rollouts of real hosts through the reference hub (self-signed TLS on 127.0.0.1), beside
# the same fleet upgraded at once, in one run: HOSTS real agents, each from a binary of
# its own (the upgrade-fixture builds the tests use, 1.0.0 to 1.0.3), settle 1 s.
#  1. a rollout of 1.0.1 (waves 1,50%,100%, max-parallel 2): start -> done, and the most
#     members draining or switching at once, as `rollout status` shows them;
#  2. 1.0.2 set for the fleet at once (the peer): set -> every host committed;
#  3. a release that crashes at start (1.0.3) by a rollout: the hosts that were ever sent
#     it, and start -> halted.
#
#   bash bench/rollout_hosts.sh [HOSTS]
set -euo pipefail
. "$(dirname "$0")/lib.sh"
HOSTS=${1:-4}
make_work rollouthosts
signed_hub 1.0.0 1.0.1 1.0.2
cleanup() {
  for d in "$WORK"/state-*; do
    for f in "$d/agent-status.json" "$d/upgrade.json"; do
      grep -o '"\(pid\|watcher_pid\|agent_pid\)": *[0-9]*' "$f" 2>/dev/null | grep -o '[0-9]*$' |
        xargs -r kill -TERM 2>/dev/null || true
    done
  done
  kill -TERM $hub 2>/dev/null || true
  sleep 1
  pkill -KILL -f "$WORK/" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
hub_url
: >"$WORK/agent.toml"
for i in $(seq "$HOSTS"); do
  id=h$i
  H agent add "$id" --token-out "$WORK/$id.token" >/dev/null
  mkdir -m 755 "$WORK/bin-$id"
  cp "$WORK/railgrid-1.0.0" "$WORK/bin-$id/railgrid"
  RAILGRID_UPGRADE_SETTLE=1s RAILGRID_UPGRADE_DEADLINE=10s RAILGRID_RUNNER_STOP_GRACE=2s \
  setsid "$WORK/bin-$id/railgrid" agent run --config "$WORK/agent.toml" --state-dir "$WORK/state-$id" \
    --log-dir "$WORK/log-$id" "${USER_FLAGS[@]}" --hub "$URL" --agent-id "$id" \
    --token-file "$WORK/$id.token" --ca-file "$WORK/hub/ca.pem" --trusted-key "$KEY" \
    2>>"$WORK/$id.stderr" &
done
now() { date +%s.%N; }
ms() { awk "BEGIN { printf \"%.0f\", ($2 - $1) * 1000 }"; }
until_ok() { # WHAT COMMAND…: polls COMMAND every 50 ms for up to 5 minutes
  local what=$1; shift
  for _ in $(seq 6000); do "$@" && return 0; sleep 0.05; done
  echo "timed out waiting for $what" >&2; tail -3 "$WORK"/h1.stderr >&2; exit 1
}
all_on() { # VERSION: every host runs it, committed
  [ "$(H agent list --json | grep -o "\"version\":\"$1\"" | wc -l || true)" -ge "$HOSTS" ] &&
    [ "$(H agent list --json | grep -o '"state":"pending_commit"' | wc -l || true)" = 0 ]
}
connected() { [ "$(H agent list --json | grep -o '"connected":true' | wc -l || true)" = "$HOSTS" ]; }
until_ok "every host connected" connected
state_of() { H rollout status "$1" | sed -n '1s/.*), \([a-z_]*\) for .*/\1/p'; }
is_state() { [ "$(state_of "$1")" = "$2" ]; }

echo "# railgrid rollout of real hosts: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $HOSTS hosts"
# 1. A rollout.
publish 1.0.1 "$WORK/railgrid-1.0.1"
t0=$(now)
H rollout start --version 1.0.1 --waves 1,50%,100% --max-parallel 2 >/dev/null
peak=0
while ! is_state r1 done; do
  n=$(H rollout status r1 --json | grep -o '"state":"\(draining\|switching\)"' | wc -l || true)
  if [ "$n" -gt "$peak" ]; then peak=$n; fi
  is_state r1 halted && { echo "halted: $(H rollout status r1)" >&2; exit 1; }
  sleep 0.1
done
t_done=$(now)
echo "rollout of 1.0.1 (waves 1,50%,100%, max-parallel 2): start -> done $(ms "$t0" "$t_done") ms, at most $peak under way at once"

# 2. The peer: the fleet's version set at once.
publish 1.0.2 "$WORK/railgrid-1.0.2"
t0=$(now)
H desired set --fleet --version 1.0.2 >/dev/null 2>&1
until_ok "every host on 1.0.2" all_on 1.0.2
echo "1.0.2 set for the fleet at once: set -> every host committed $(ms "$t0" "$(now)") ms"

# 3. A release that crashes at start, by a rollout.
printf '#!/bin/sh\nif [ "$1 $2" = "version --json" ]; then echo "{\\"version\\":\\"1.0.3\\"}"; exit 0; fi\nexit 1\n' >"$WORK/crash"
chmod 755 "$WORK/crash"
publish 1.0.3 "$WORK/crash"
t0=$(now)
H rollout start --version 1.0.3 --waves 1,50%,100% --max-parallel 2 >/dev/null
until_ok "the rollout halted" is_state r2 halted
t_halt=$(now)
sent=$(H rollout status r2 --json | grep -o '"state":"\(rolled_back\|draining\|switching\|committed\|failed\)"' | wc -l || true)
echo "crash at start by a rollout: $sent host(s) of $HOSTS ever sent it, halted $(ms "$t0" "$t_halt") ms after the start"
