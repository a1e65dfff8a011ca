#!/usr/bin/env bash
# `make demo`: a Petrel node (`petrel node`: runtime + agent in one process)
# in a temporary root, running the sample pods of examples/manifests:
# pods starting, a container crashing and restarting with backoff, and a
# manifest deleted (its pod terminated gracefully). Then everything is
# stopped and cleaned up.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${PETREL_BIN:-target/debug}
PETREL=$BIN/petrel
IMAGE=${PETREL_IMAGES:-build/images}/busybox-oci.tar
WORK=$(mktemp -d /tmp/petrel-demo.XXXXXX)
SOCK=$WORK/state/petrel.sock
PORT=${PETREL_DEMO_PORT:-10355}
SERVER=http://127.0.0.1:$PORT
export PETREL_ENDPOINT=unix://$SOCK
NODE_PID=""
WATCH_PID=""

say() { printf '\n\033[1;34m== %s\033[0m\n' "$*"; }

cleanup() {
  set +e
  [ -n "$WATCH_PID" ] && kill "$WATCH_PID" 2>/dev/null && wait "$WATCH_PID" 2>/dev/null
  if [ -n "$NODE_PID" ] && kill -0 "$NODE_PID" 2>/dev/null; then
    # Deleting the manifests makes the agent terminate the pods.
    rm -f "$WORK"/manifests/*.yaml
    for _ in $(seq 1 100); do
      [ -z "$($PETREL ctl pods -q 2>/dev/null)" ] && break
      sleep 0.1
    done
    for p in $($PETREL ctl pods -q 2>/dev/null); do $PETREL ctl rmp -f "$p" >/dev/null 2>&1; done
    kill -TERM "$NODE_PID" 2>/dev/null; wait "$NODE_PID" 2>/dev/null
  fi
  for c in /sys/fs/cgroup/*/petrel-demo /sys/fs/cgroup/petrel-demo; do
    [ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null
  done
  rm -rf "$WORK"
}
trap cleanup EXIT

mkdir -p "$WORK/manifests"
say "starting petrel node (runtime + agent; root $WORK/root, manifests $WORK/manifests)"
$PETREL node --root "$WORK/root" --state "$WORK/state" --default-cgroup-parent /petrel-demo \
  --manifests "$WORK/manifests" --listen "127.0.0.1:$PORT" --log-level info 2> "$WORK/node.log" &
NODE_PID=$!
for _ in $(seq 1 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
[ -S "$SOCK" ] || { echo "node did not start:"; cat "$WORK/node.log"; exit 1; }
$PETREL ctl version

say "importing the busybox test image (no registry needed)"
$PETREL ctl image import "$(realpath "$IMAGE")"

say "watching pods (petrel get pods -w) while manifests arrive"
$PETREL get pods -A -w --server "$SERVER" &
WATCH_PID=$!
sleep 0.5
say "copying examples/manifests/*.yaml into the manifest directory"
cp examples/manifests/*.yaml "$WORK/manifests/"
sleep 15
kill "$WATCH_PID" 2>/dev/null; wait "$WATCH_PID" 2>/dev/null || true
WATCH_PID=""

say "petrel get pods -A -o wide"
$PETREL get pods -A -o wide --server "$SERVER"
say "the crasher's status: restarts with backoff (CrashLoopBackOff between them)"
$PETREL get pods crasher -n demo -o json --server "$SERVER" \
  | grep -E '"(restartCount|reason|exitCode|message)"' || true
say "petrel ctl ps -a (the runtime's view)"
$PETREL ctl ps -a
CID=$($PETREL ctl ps -q --name greeter | head -n 1)
say "petrel ctl logs greeter"
$PETREL ctl logs "$CID" | head -n 5

say "deleting web.yaml: the pod is terminated gracefully"
$PETREL get pods -A -w --server "$SERVER" &
WATCH_PID=$!
sleep 0.3
rm "$WORK/manifests/web.yaml"
sleep 5
kill "$WATCH_PID" 2>/dev/null; wait "$WATCH_PID" 2>/dev/null || true
WATCH_PID=""
say "petrel get pods -A"
$PETREL get pods -A --server "$SERVER"

say "agent health and a few metrics"
curl -s "$SERVER/healthz" 2>/dev/null || $PETREL get pods -A --server "$SERVER" >/dev/null
echo
curl -s "$SERVER/metrics" 2>/dev/null | grep -E '^kubelet_(running_pods|running_containers|evented_pleg_connection_success)' || true

say "done: stopping the node (pods are removed first); last lines of its log:"
tail -n 8 "$WORK/node.log"
