#!/usr/bin/env bash
# `make demo`: start a Petrel runtime in a temporary root, import the test
# image, run a pod whose container prints to its log, and show pods,
# containers, logs and the live event stream; then stop and clean up.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${PETREL_BIN:-target/debug}
PETREL=$BIN/petrel
IMAGE=${PETREL_IMAGES:-build/images}/busybox-oci.tar
WORK=$(mktemp -d /tmp/petrel-demo.XXXXXX)
SOCK=$WORK/state/petrel.sock
export PETREL_ENDPOINT=unix://$SOCK
RT_PID=""
EV_PID=""

say() { printf '\n\033[1;34m== %s\033[0m\n' "$*"; }

cleanup() {
  set +e
  if [ -S "$SOCK" ]; then
    for p in $($PETREL ctl pods -q 2>/dev/null); do $PETREL ctl rmp -f "$p" >/dev/null 2>&1; done
  fi
  [ -n "$EV_PID" ] && kill "$EV_PID" 2>/dev/null && wait "$EV_PID" 2>/dev/null
  if [ -n "$RT_PID" ]; then kill -TERM "$RT_PID" 2>/dev/null; wait "$RT_PID" 2>/dev/null; fi
  for c in /sys/fs/cgroup/*/petrel-demo /sys/fs/cgroup/petrel-demo; do
    [ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null
  done
  rm -rf "$WORK"
}
trap cleanup EXIT

say "starting petrel runtime (root $WORK/root, state $WORK/state)"
$PETREL runtime --root "$WORK/root" --state "$WORK/state" --default-cgroup-parent /petrel-demo \
  --log-level info 2> "$WORK/runtime.log" &
RT_PID=$!
for _ in $(seq 1 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
[ -S "$SOCK" ] || { echo "runtime did not start:"; cat "$WORK/runtime.log"; exit 1; }
$PETREL ctl version

say "importing the busybox test image"
$PETREL ctl image import "$(realpath "$IMAGE")"
$PETREL ctl images

say "live event stream (petrel ctl events) in the background"
$PETREL ctl events &
EV_PID=$!
sleep 0.5

say "running a pod from examples/demo-pod.yaml"
$PETREL ctl run examples/demo-pod.yaml
sleep 3

say "petrel ctl pods"
$PETREL ctl pods
say "petrel ctl ps"
$PETREL ctl ps
CID=$($PETREL ctl ps -q | head -n 1)
say "petrel ctl logs $CID"
$PETREL ctl logs "$CID"
say "petrel ctl exec $CID -- cat /etc/hostname"
$PETREL ctl exec "$CID" -- cat /etc/hostname
say "petrel ctl stats"
$PETREL ctl stats

say "stopping and removing"
POD=$($PETREL ctl pods -q | head -n 1)
$PETREL ctl stop "$CID"
$PETREL ctl rm "$CID"
$PETREL ctl stopp "$POD"
$PETREL ctl rmp "$POD"
sleep 0.5
say "runtime metrics (events)"
$PETREL ctl metrics | grep -E '^petrel_runtime_(events|event_subscriber)' || true
say "done: stopping the runtime; runtime log in the last lines below"
tail -n 5 "$WORK/runtime.log"
