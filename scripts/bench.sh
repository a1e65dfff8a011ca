#!/usr/bin/env bash
# `make bench`: measure the Petrel runtime against references taken in the
# same run and rewrite docs/PERFORMANCE.md (tools/bench does the work).
#
#   scripts/bench.sh [petrel-bench flags]     e.g. --idle-seconds 5 --out /tmp/P.md
#   scripts/bench.sh --only agent --agent-idle-seconds 5 --agent-sizes 2,4 \
#       --agent-pods 4 --agent-relist-pods 4 --agent-large-pods 20 --out /tmp/A.md   # quick agent run
#   scripts/bench.sh --only pull --out /tmp/P.md                # image pull and create (P14-P15)
#   scripts/bench.sh --only net --out /tmp/N.md                 # CNI pods, exec and port-forward vs containerd (P16-P18)
#   scripts/bench.sh --only nri --out /tmp/R.md                 # NRI: CreateContainer with plugins, Synchronize (P19-P20)
#   scripts/bench.sh --only eviction --out /tmp/E.md            # eviction: memory crossing → stop call, idle CPU (P21-P22)
#   scripts/bench.sh --only kubelet --out /tmp/K.md             # the real kubelet beside Petrel (P23-P27, critest counts)
#   scripts/bench.sh --only critest --out /tmp/C.md             # critest's benchmarks, Petrel vs containerd 2.x (P28)
#   scripts/bench.sh --only controller --out /tmp/S.md          # the controller kit vs controller-runtime (P29-P32)
#   scripts/bench.sh --only cluster --out /tmp/N.md             # nodes of a real cluster: petrel node vs kubelet (P33-P37)
#   scripts/bench.sh --only vm --out /tmp/V.md                  # cgroup v2 vs v1 in test VM guests (P38-P39; make vm)
#
# Needs root, runc, target/release/petrel (make release; under
# $CARGO_TARGET_DIR/release when that is set, as cargo puts it) and the busybox test
# image (make image; IMAGES=dir overrides build/images); the pull figures also
# docker-registry, skopeo and umoci (make deps); the kubelet figures the
# peers (make peers: kubelet, containerd 2.x) and the conformance kit's
# images (make conformance-images); the VM figures the test VM's kernel
# (make vm). Everything the bench
# creates lives in one temporary directory and the cgroup /petrel-bench-<id>;
# the bench removes them itself, and the trap below sweeps them if the bench
# died too hard to do so.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $(id -u) != 0 ]]; then
    echo "bench: run as root (containers, mounts and cgroups are created)" >&2
    exit 1
fi

images=${IMAGES:-build/images}
image=$images/busybox-oci.tar
# pause-oci.tar is containerd's sandbox image for the agent figures on it.
if [[ ! -f $image || ! -f $images/pause-oci.tar ]]; then
    scripts/build-test-image.sh "$(realpath -m "$images")"
fi
# The part asked for (--only X or --only=X; everything by default).
only=all
prev=
for a in "$@"; do
    case $a in
    --only=*) only=${a#--only=} ;;
    *) if [[ $prev == --only ]]; then only=$a; fi ;;
    esac
    prev=$a
done
# containerd 1.7 for the agent and net figures on it (`make containerd`;
# cached); the other parts do not use it. Without it those figures are
# reported as not measured, with the reason.
if [[ $only =~ ^(all|agent|net|kubelet)$ && ! -x build/containerd-1.7/usr/bin/containerd ]]; then
    scripts/containerd.sh build ||
        echo "bench: scripts/containerd.sh failed; the agent is measured on Petrel's runtime only" >&2
fi
# The conformance kit's images (cached: a second run does nothing) hold the
# busybox and pause images of the kubelet figures.
if [[ $only =~ ^(all|kubelet|cluster)$ ]]; then
    scripts/conformance-images.sh >/dev/null ||
        echo "bench: scripts/conformance-images.sh failed (the bench names what is missing)" >&2
fi

# The test VM's kernel and initramfs for the cgroup v2 against v1 figures
# (cached: a second run does nothing).
if [[ $only =~ ^(all|vm)$ ]]; then
    scripts/vm.sh build >/dev/null ||
        echo "bench: scripts/vm.sh failed (the VM figures say what is missing)" >&2
fi

id=$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
work=$(mktemp -d /tmp/petrel-bench.XXXXXX)
cgroup=petrel-bench-$id
# The test kit's peers (kubelet, runtimes, networks, registry) make their
# directories here, where the sweep below finds them.
export PETREL_KIT_TMPDIR=$work/kit

# Only acts when the bench could not clean up after itself (it removes $work
# last). Processes are found by pid and checked by their command line, never
# by name.
sweep() {
    local rc=$?
    set +e
    if [[ -d $work ]]; then
        echo "bench: sweeping what the bench left in $work" >&2
        # The agents, kubelets, runtimes, containerd, registries and test VMs the
        # bench started: every pid file under the work directory (agents
        # first, so none restarts what the sweep stops), each process
        # checked to name the work directory on its command line.
        local name f pid
        for name in agent.pid kubelet.pid runtime.pid containerd.pid registry.pid qemu.pid; do
            while IFS= read -r f; do
                pid=$(<"$f")
                [[ $pid =~ ^[0-9]+$ ]] || continue
                if [[ -r /proc/$pid/cmdline ]] &&
                    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$work/"; then
                    kill -TERM "$pid"
                    for _ in $(seq 1 150); do [[ -d /proc/$pid ]] || break; sleep 0.1; done
                fi
            done < <(find "$work" -maxdepth 4 -name "$name" -type f 2>/dev/null)
        done
        # containerd's shims, named by their -address in the work directory.
        local p
        for p in /proc/[0-9]*; do
            if tr '\0' ' ' <"$p/cmdline" 2>/dev/null |
                grep -qF -- "-address $work/"; then
                kill -KILL "${p#/proc/}" 2>/dev/null
            fi
        done
        # runc state roots: each runtime's state/runc, containerd's runc (the
        # bench's and the kit's) and the raw runc measurement's runc-root.
        local root c
        while IFS= read -r root; do
            for c in $(runc --root "$root" list -q 2>/dev/null); do
                runc --root "$root" delete --force "$c" >/dev/null 2>&1
            done
        done < <(find "$work" -maxdepth 4 -type d \( -path '*/state/runc' -o -path "$work/containerd/runc" -o -path "$work/kit/pkc.*/runc" -o -name runc-root \) 2>/dev/null)
        # The kit's CNI bridges, each named in its network's `bridge` file.
        local b
        while IFS= read -r f; do
            b=$(<"$f")
            [[ $b =~ ^pk[0-9a-f]+$ && -e /sys/class/net/$b ]] && ip link delete "$b"
        done < <(find "$work/kit" -maxdepth 2 -name bridge -type f 2>/dev/null)
        awk -v w="$work" '$5 == w || index($5, w "/") == 1 { print $5 }' /proc/self/mountinfo |
            sort -r | while read -r m; do umount -l "$m"; done
        local d
        for d in /sys/fs/cgroup/*/"$cgroup" /sys/fs/cgroup/"$cgroup"; do
            [[ -d $d ]] && find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
        done
        rm -rf "$work"
    fi
    exit "$rc"
}
trap sweep EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [[ -n ${MAKELEVEL:-} ]]; then
    command="make bench"
else
    command="scripts/bench.sh${*:+ $*}"
fi

# What users run: `make release`'s binaries, the shim linked statically
# (`make shim-release`), measured as they are. Built with the workspace's
# feature set, as `make release` builds it: a
# `-p petrel-bench` build resolves features differently and would rebuild
# every dependency. After `make release` this is a no-op.
cargo build --release --workspace --bins
# Where cargo put them: $CARGO_TARGET_DIR when set (a worktree building
# into a target directory of its own), else target/.
release=${CARGO_TARGET_DIR:-target}/release
# That build links a dynamic shim over the static one when `make
# shim-release` made it last: the static one is linked again here, after.
if [[ ! -x $release/petrel-shim ]] || ldd "$release/petrel-shim" >/dev/null 2>&1; then
    make -s shim-release
fi
shim_args=(--shim "$(realpath "$release/petrel-shim")")
"$release/petrel-bench" \
    --build-dir "$(realpath -m build)" \
    --petrel "$(realpath "$release/petrel")" \
    --podset-controller "$(realpath -m "$release/petrel-podset-controller")" \
    --image "$(realpath "$image")" \
    --work-dir "$work" \
    --id "$id" \
    --command "$command" \
    "${shim_args[@]}" \
    "$@"
