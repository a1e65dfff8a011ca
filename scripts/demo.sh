#!/usr/bin/env bash
# `make demo`: a Petrel node (`petrel node`: runtime + agent in one process)
# in a temporary root, running the sample pods of examples/manifests:
# the sample image pulled from a local registry (Debian's docker-registry on
# 127.0.0.1, reached through a hosts.toml mirror for docker.io) with
# per-layer progress, pods starting on a CNI bridge network (examples/cni:
# bridge + host-local + loopback + portmap on 10.199.0.0/24) with their IPs,
# HTTP to a pod through its IP and its host port, a container crashing and
# restarting with backoff, and a manifest deleted (its pod terminated
# gracefully).
# Then the node is stopped with --drain-on-exit (its pods are stopped and
# removed first) and everything is cleaned up, the registry and its storage
# included.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${PETREL_BIN:-target/debug}
PETREL=$BIN/petrel
IMAGE=${PETREL_IMAGES:-build/images}/busybox-oci.tar
WORK=$(mktemp -d /tmp/petrel-demo.XXXXXX)
SOCK=$WORK/state/petrel.sock
PORT=${PETREL_DEMO_PORT:-10355}
# The agent's API is on its unix socket (root only); its TCP port serves
# /healthz and /metrics.
AGENT_SOCK=$WORK/agent/agent.sock
HEALTH=http://127.0.0.1:$PORT
export PETREL_ENDPOINT=unix://$SOCK
export PETREL_AGENT=unix://$AGENT_SOCK
NODE_PID=""
WATCH_PID=""
REGISTRY_PID=""
# The examples' image; the registry serves it as petrel/busybox:latest.
DEMO_IMAGE=docker.io/petrel/busybox:latest

# Headings in colour on a terminal only: a log or a pipe gets plain text.
if [ -t 1 ]; then
  say() { printf '\n\033[1;34m== %s\033[0m\n' "$*"; }
else
  say() { printf '\n== %s\n' "$*"; }
fi

cleanup() {
  set +e
  [ -n "$WATCH_PID" ] && kill "$WATCH_PID" 2>/dev/null && wait "$WATCH_PID" 2>/dev/null
  if [ -n "$NODE_PID" ] && kill -0 "$NODE_PID" 2>/dev/null; then
    # The node runs with --drain-on-exit: SIGTERM makes its agent stop and
    # remove every pod (grace periods, preStop hooks), then it exits.
    kill -TERM "$NODE_PID" 2>/dev/null; wait "$NODE_PID" 2>/dev/null
  fi
  # The demo network's bridge and lease directory (the bridge plugin
  # leaves its bridge; every pod's veth, lease and rules went with it).
  ip link delete petrel-demo0 2>/dev/null
  rm -rf /run/petrel-demo
  if [ -n "$REGISTRY_PID" ]; then
    kill -TERM "$REGISTRY_PID" 2>/dev/null; wait "$REGISTRY_PID" 2>/dev/null
  fi
  for c in /sys/fs/cgroup/*/petrel-demo /sys/fs/cgroup/petrel-demo; do
    [ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null
  done
  rm -rf "$WORK"
}
trap cleanup EXIT

# A local registry: Debian's docker-registry on 127.0.0.1, storage in $WORK.
# A port that looks free can still be taken before the registry binds it,
# so a registry that exits at start is retried on another port.
start_registry() {
  local reg=$WORK/registry port
  mkdir -p "$reg"
  for _ in 1 2 3 4 5; do
    port=$(( 20000 + RANDOM % 30000 ))
    ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && continue
    cat > "$reg/config.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $reg/data
http:
  addr: 127.0.0.1:$port
EOF
    docker-registry serve "$reg/config.yml" > "$reg/registry.log" 2>&1 &
    REGISTRY_PID=$!
    for _ in $(seq 1 50); do
      kill -0 "$REGISTRY_PID" 2>/dev/null || break
      if curl -fs "http://127.0.0.1:$port/v2/" >/dev/null 2>&1; then
        REGISTRY=127.0.0.1:$port
        return 0
      fi
      sleep 0.1
    done
    kill "$REGISTRY_PID" 2>/dev/null; wait "$REGISTRY_PID" 2>/dev/null || true
    REGISTRY_PID=""
  done
  echo "docker-registry did not start:"; cat "$reg/registry.log"; return 1
}

mkdir -p "$WORK/manifests"
say "starting a local registry (docker-registry on 127.0.0.1, storage in $WORK/registry)"
start_registry
echo "registry at $REGISTRY"
skopeo copy --quiet --dest-tls-verify=false "oci-archive:$IMAGE" \
  "docker://$REGISTRY/petrel/busybox:latest"
echo "pushed $IMAGE as $REGISTRY/petrel/busybox:latest (skopeo)"
# docker.io is mirrored by the local registry, so the manifests' image
# name stays as it is; the repository path is kept on the mirror.
mkdir -p "$WORK/certs.d/docker.io"
cat > "$WORK/certs.d/docker.io/hosts.toml" <<EOF
server = "https://registry-1.docker.io"

[host."http://$REGISTRY"]
  capabilities = ["pull", "resolve"]
EOF

# NRI: the sample ulimit adjuster as a pre-registered plugin (launched by
# the runtime on fd 3); hello.yaml's annotation sets its greeter's rlimit.
mkdir -p "$WORK/nri/plugins"
ln -s "$(realpath "$BIN/petrel-nri-ulimit-adjuster")" "$WORK/nri/plugins/10-ulimit-adjuster"

# Only the memory threshold: kubelet's default disk thresholds (10 % / 15 %
# free) may hold on a development machine's disk and would refuse the pods.
say "starting petrel node (runtime + agent; root $WORK/root, manifests $WORK/manifests)"
$PETREL node --root "$WORK/root" --state "$WORK/state" --default-cgroup-parent /petrel-demo \
  --manifests "$WORK/manifests" --listen "127.0.0.1:$PORT" --agent-socket "$AGENT_SOCK" --log-level info \
  --registry-config-dir "$WORK/certs.d" --cni-conf-dir examples/cni \
  --nri-socket "$WORK/nri/nri.sock" --nri-plugin-path "$WORK/nri/plugins" \
  --nri-plugin-config-path "$WORK/nri/conf.d" \
  --eviction-hard 'memory.available<100Mi' --drain-on-exit 2> "$WORK/node.log" &
NODE_PID=$!
for _ in $(seq 1 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
[ -S "$SOCK" ] || { echo "node did not start:"; cat "$WORK/node.log"; exit 1; }
$PETREL ctl version
say "pod network: $(sed -n 's/.*"name": "\(petrel-demo\)".*/\1/p' examples/cni/10-petrel-demo.conflist) (examples/cni/10-petrel-demo.conflist)"
$PETREL ctl info -o table | grep -E "^(TYPE|NetworkReady)" || true

say "petrel ctl pull $DEMO_IMAGE (through the docker.io mirror $REGISTRY)"
$PETREL ctl pull "$DEMO_IMAGE"
$PETREL ctl images

say "watching pods (petrel get pods -w) while manifests arrive"
$PETREL get pods -A -w &
WATCH_PID=$!
sleep 0.5
say "copying examples/manifests/*.yaml into the manifest directory"
cp examples/manifests/*.yaml "$WORK/manifests/"
sleep 15
kill "$WATCH_PID" 2>/dev/null; wait "$WATCH_PID" 2>/dev/null || true
WATCH_PID=""

say "petrel get pods -A -o wide (pod IPs from the CNI network)"
$PETREL get pods -A -o wide
WEB_IP=$($PETREL get pods web -n demo -o json | sed -n 's/.*"podIP": *"\([^"]*\)".*/\1/p' | head -n 1)
say "HTTP to the web pod at its IP $WEB_IP:8080, and through host port 18080 (portmap)"
curl -s --max-time 5 "http://$WEB_IP:8080/index.html" || echo "(no answer from $WEB_IP)"
curl -s --max-time 5 "http://127.0.0.1:18080/index.html" || echo "(no answer on 127.0.0.1:18080)"
say "the crasher's status: restarts with backoff (CrashLoopBackOff between them)"
$PETREL get pods crasher -n demo -o json \
  | grep -E '"(restartCount|reason|exitCode|message)"' || true
say "petrel ctl ps -a (the runtime's view)"
$PETREL ctl ps -a
CID=$($PETREL ctl ps -q --name greeter | head -n 1)
say "petrel ctl logs greeter"
$PETREL ctl logs "$CID" | head -n 5
say "petrel ctl nri (the runtime's NRI plugins: the ulimit adjuster set the greeter's open-files limit)"
$PETREL ctl nri

say "deleting web.yaml: the pod is terminated gracefully"
$PETREL get pods -A -w &
WATCH_PID=$!
sleep 0.3
rm "$WORK/manifests/web.yaml"
sleep 5
kill "$WATCH_PID" 2>/dev/null; wait "$WATCH_PID" 2>/dev/null || true
WATCH_PID=""
say "petrel get pods -A"
$PETREL get pods -A

say "agent health and a few metrics (its TCP port; pods, logs and exec only on its socket $AGENT_SOCK)"
curl -s "$HEALTH/healthz" 2>/dev/null || true
echo
curl -s -o /dev/null -w 'GET /pods on the TCP port: %{http_code}\n' "$HEALTH/pods" 2>/dev/null || true
curl -s "$HEALTH/metrics" 2>/dev/null | grep -E '^kubelet_(running_pods|running_containers|evented_pleg_connection_success)' || true

say "done: stopping the node (--drain-on-exit: its pods are stopped and removed first)"
kill -TERM "$NODE_PID"; wait "$NODE_PID" || true
NODE_PID=""
echo "last lines of its log:"
tail -n 8 "$WORK/node.log"
echo "containers left in its runtime root: $(find "$WORK/state/runc" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)"
