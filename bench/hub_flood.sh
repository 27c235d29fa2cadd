#!/usr/bin/env bash
# A flood of clients without a token (TLS completed, headers that never end) against one
# reference hub, beside honest long-polling agents: hub memory before, at the peak and
# after, and the honest agents' fleet-change latency and a new agent's first reconcile.
#
#   bash bench/hub_flood.sh [FLOOD_CONNECTIONS] [HONEST_AGENTS] [ROUNDS]
#
# RAILGRID_BIN=path runs another build of the hub (say, an older one) with the same client;
# FLOOD_PAD_KIB (default 1024) is what each flood connection sends of its headers.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
FLOOD=${1:-6000}
HONEST=${2:-200}
ROUNDS=${3:-5}
build_release hub_flood
BIN=${RAILGRID_BIN:-./target/release/railgrid}
make_work hubflood
ulimit -n "$(ulimit -Hn)"
serve_hub "$BIN" --max-connections 20000
trap 'kill -TERM $hub 2>/dev/null; wait $hub 2>/dev/null; rm -rf "$WORK"' EXIT
hub_url
echo "# railgrid hub flood benchmark: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $FLOOD flood connections, $HONEST honest agents, hub $("$BIN" version)"
./target/release/examples/hub_flood "$WORK/hub" "$FLOOD" "$HONEST" "$ROUNDS"
