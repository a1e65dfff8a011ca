#!/usr/bin/env bash
# The test VM's kernel and initramfs: a pure cgroup v2 guest for the tests
# of Petrel's cgroup v2 code paths (this machine is cgroup v1 hybrid; see
# crates/testkit/src/vm.rs for how a guest is booted and used), or a v1
# hybrid one for the bench's comparison of the two (petrel.cgroup=v1).
#
# Nothing is installed: Debian bookworm's kernel package is downloaded with
# a private apt sources list (as scripts/containerd.sh does), unpacked with
# `dpkg-deb -x` and cached by its version, outside the clone, in
#   $PETREL_VM_CACHE/<version>/       (default /var/cache/petrel/vm)
#     root/                           the package's files; its modules with
#                                     `depmod -b` run on them
#     vmlinux                         the uncompressed kernel (ELF, booted by
#                                     QEMU through its PVH entry point: no
#                                     decompression at every boot)
#     KERNEL_RELEASE                  e.g. 6.1.0-50-amd64
#     initrd-<key>.cpio.gz            busybox-static, the modules that mount
#                                     the root, and the guest's init below;
#                                     <key> hashes what it is made of
# and linked into build/vm/ (vmlinux, initrd.img, modules/, KERNEL_RELEASE,
# VERSION). A second run does nothing.
#
# Usage: scripts/vm.sh build [BUILD_DIR]   (default: build)
set -euo pipefail
shopt -s inherit_errexit

cmd=${1:-}
if [[ $cmd != build ]]; then
    echo "usage: scripts/vm.sh build [BUILD_DIR]" >&2
    exit 2
fi
build=$(realpath -m "${2:-build}")
out=$build/vm
cache=${PETREL_VM_CACHE:-/var/cache/petrel/vm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
suite=bookworm
apt_dir=$build/apt/$suite
busybox=/bin/busybox
script=$(readlink -f "${BASH_SOURCE[0]}")

# What the initramfs loads, in this order with what they need first, to
# reach the host's root over virtio-9p and the agent's virtio-serial port.
initrd_modules=(virtio_pci virtio_console 9pnet_virtio 9p overlay)

die() {
    echo "vm.sh: $*" >&2
    exit 1
}

for tool in apt-get apt-cache dpkg-deb depmod modprobe xz gzip sha256sum flock; do
    command -v "$tool" >/dev/null || die "$tool is needed (make deps installs it)"
done
[[ -x $busybox ]] || die "$busybox is needed (apt-get install busybox-static)"

apt_private() {
    local tool=$1
    shift
    "$tool" -q \
        -o Dir::Etc::SourceList="$apt_dir/sources.list" \
        -o Dir::Etc::SourceParts=/dev/null \
        -o Dir::State::Lists="$apt_dir/lists" \
        -o Dir::Cache="$apt_dir/cache" \
        -o Dir::Cache::archives="$apt_dir/cache/archives" \
        -o Debug::NoLocking=true \
        -o APT::Sandbox::User=root \
        "$@"
}

# The initramfs's key: this script (which holds the init), busybox and the
# kernel release it is for.
initrd_key() {
    { sha256sum "$script" "$busybox" | cut -d' ' -f1; echo "$1"; } | sha256sum | cut -c1-16
}

# --- already there? ----------------------------------------------------------
# Only local files are looked at: no apt query when build/vm is complete.
if [[ -f $out/VERSION && -f $out/KERNEL_RELEASE ]]; then
    have=$(readlink -f "$out/initrd.img" 2>/dev/null || true)
    want=$cache/$(cat "$out/VERSION")/initrd-$(initrd_key "$(cat "$out/KERNEL_RELEASE")").cpio.gz
    if [[ -f $out/vmlinux && -d $out/modules/ && $have == "$want" && -f $want ]]; then
        echo "vm.sh: $out is up to date (kernel $(cat "$out/KERNEL_RELEASE"))"
        exit 0
    fi
fi

# --- the kernel package --------------------------------------------------------
if [[ ! -f $apt_dir/lists/.updated ]]; then
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
    echo "deb [signed-by=$keyring] $mirror $suite main" >"$apt_dir/sources.list"
    apt_private apt-get update >&2
    touch "$apt_dir/lists/.updated"
fi
# The metapackage names the current ABI (linux-image-6.1.0-N-amd64).
pkg=$(apt_private apt-cache depends linux-image-amd64 |
    awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }')
[[ -n $pkg ]] || die "no linux-image-*-amd64 behind linux-image-amd64 in $suite"
version=$(apt_private apt-cache show "$pkg" | awk '$1 == "Version:" { print $2; exit }')
release=${pkg#linux-image-}
dir=$cache/$version

mkdir -p "$cache/locks" || die "cannot write the cache $cache (set PETREL_VM_CACHE)"
# Two runs at once (two clones, CI): the second waits, then finds it done.
exec {lock_fd}>"$cache/locks/$version"
flock "$lock_fd"

if [[ ! -f $dir/vmlinux ]]; then
    tmp=$cache/.tmp-$version-$$
    rm -rf "$cache/.tmp-$version-"*
    mkdir -p "$tmp"
    echo "vm.sh: fetching $pkg $version from $suite" >&2
    (cd "$tmp" && apt_private apt-get download "$pkg=$version" >&2)
    deb=$(find "$tmp" -maxdepth 1 -name "${pkg}_*.deb" -print -quit)
    [[ -n $deb ]] || die "$pkg was not downloaded"
    dpkg-deb -x "$deb" "$tmp/root"
    rm -f "$deb"
    [[ -d $tmp/root/lib/modules/$release ]] || die "$pkg has no lib/modules/$release"
    depmod -b "$tmp/root" "$release"
    # The bzImage holds the kernel xz-compressed after its set-up code:
    # unpacked once here, QEMU boots the ELF directly (PVH), which skips
    # the guest's self-decompression, slow under software emulation.
    vmlinuz=$tmp/root/boot/vmlinuz-$release
    offset=$(LC_ALL=C grep -m1 -obUaP '\xFD7zXZ\x00' "$vmlinuz" | cut -d: -f1)
    [[ -n $offset ]] || die "no xz stream in $vmlinuz"
    # xz stops at the stream's end, before the data after it: no pipe, or
    # the writer's SIGPIPE would fail the script.
    xz -dc --single-stream <(tail -c "+$((offset + 1))" "$vmlinuz") >"$tmp/vmlinux"
    [[ $(head -c 4 "$tmp/vmlinux" | od -An -c | tr -d ' ') == '177ELF' ]] ||
        die "$vmlinuz did not unpack to an ELF kernel"
    echo "$release" >"$tmp/KERNEL_RELEASE"
    echo "$version" >"$tmp/VERSION"
    rm -rf "$dir"
    mv "$tmp" "$dir"
fi

# --- the initramfs -------------------------------------------------------------
key=$(initrd_key "$release")
initrd=$dir/initrd-$key.cpio.gz
if [[ ! -f $initrd ]]; then
    tmp=$(mktemp -d "$cache/.initrd-XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    mkdir -p "$tmp"/{bin,dev,proc,sys,modules,newroot}
    cp "$busybox" "$tmp/bin/busybox"
    : >"$tmp/modules/order"
    for m in "${initrd_modules[@]}"; do
        modprobe -d "$dir/root" -S "$release" --show-depends "$m"
    done | awk '$1 == "insmod" && !seen[$2]++ { print $2 }' | while read -r ko; do
        cp "$ko" "$tmp/modules/"
        basename "$ko" >>"$tmp/modules/order"
    done
    sed -n '/^#### guest init ####$/,$p' "$script" | tail -n +2 >"$tmp/init"
    chmod 755 "$tmp/init" "$tmp/bin/busybox"
    (cd "$tmp" && find . -mindepth 1 | LC_ALL=C sort | "$busybox" cpio -o -H newc 2>/dev/null) |
        gzip -n -1 >"$initrd.tmp.$$"
    # Initramfs of other keys stay: another clone may use an older init.
    mv "$initrd.tmp.$$" "$initrd"
fi
exec {lock_fd}>&-

# --- build/vm ----------------------------------------------------------------
mkdir -p "$out"
ln -sfn "$dir/vmlinux" "$out/vmlinux"
ln -sfn "$initrd" "$out/initrd.img"
ln -sfn "$dir/root/lib/modules/$release" "$out/modules"
echo "$release" >"$out/KERNEL_RELEASE"
echo "$version" >"$out/VERSION"
echo "vm.sh: kernel $release ($version) and initramfs $key in $out (cached in $dir)"
exit 0

# The guest's /init (busybox sh), copied into the initramfs from here on.
# Everything below the marker is the init; it ends the script above.
#### guest init ####
#!/bin/busybox sh
# Petrel's test VM, stage 1 (PID 1 in the initramfs; scripts/vm.sh): mounts
# the host's root read-only over virtio-9p with a tmpfs overlay on top,
# the run's work directory read-write at its host path, cgroup2 with its
# controllers enabled (or the v1 hybrid layout with petrel.cgroup=v1),
# then switches root (runc cannot pivot_root out of an initramfs) and runs
# the agent; powers off when the agent ends.
# Parameters come on the kernel command line: petrel.work=DIR
# petrel.agent=PATH petrel.modules=DIR (the guest kernel's unpacked modules,
# a path on the host's root), petrel.cgroup=v2|v1 (v2 by default; v1: this
# host's hybrid layout, for the bench's comparison, on a kernel booted
# without cgroup_no_v1=all), petrel.init=agent|systemd (agent by default;
# systemd: the host's systemd becomes PID 1 on v2 and starts only the
# agent and the system bus, see below).
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

fail() {
    echo "petrel-vm init: $*" >/dev/console
    poweroff -f
}

while read -r ko; do
    insmod "/modules/$ko" || fail "insmod $ko"
done </modules/order

work= agent= modules= cgroup=v2 init=agent
for arg in $(cat /proc/cmdline); do
    case $arg in
    petrel.cgroup=*) cgroup=${arg#*=} ;;
    petrel.init=*) init=${arg#*=} ;;
    petrel.work=*) work=${arg#*=} ;;
    petrel.agent=*) agent=${arg#*=} ;;
    petrel.modules=*) modules=${arg#*=} ;;
    esac
done
[ -n "$work" ] && [ -n "$agent" ] && [ -n "$modules" ] ||
    fail "petrel.work, petrel.agent and petrel.modules are needed on the command line"

# 9p: the largest message the virtio transport takes; the read-only root
# caches freely (nothing changes it while a test runs), the work directory
# not at all (both sides write it).
mkdir -p /lower /rw
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=loose,ro hostroot /lower ||
    fail "mount the host's root (9p tag hostroot)"
mount -t tmpfs -o mode=0755 tmpfs /rw
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot ||
    fail "mount the overlay on the host's root"

r=/newroot
for d in proc sys dev; do
    mount --move /$d $r/$d || fail "move /$d"
done
mkdir -p $r/dev/pts $r/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts $r/dev/pts
mount -t tmpfs -o mode=1777 tmpfs $r/dev/shm
mount -t tmpfs -o mode=1777 tmpfs $r/tmp
mount -t tmpfs -o mode=0755 tmpfs $r/run
if [ "$cgroup" = v1 ]; then
    # This host's hybrid layout (systemd's "hybrid"): one v1 hierarchy per
    # controller, cpu and cpuacct together and net_cls and net_prio
    # together as distributions mount them, and a cgroup2 without
    # controllers at unified/ (PSI per cgroup lives there).
    cg=$r/sys/fs/cgroup
    mount -t tmpfs -o mode=0755,nosuid,nodev,noexec cgroup $cg || fail "mount a tmpfs at /sys/fs/cgroup"
    for c in cpu,cpuacct cpuset memory pids blkio devices freezer hugetlb net_cls,net_prio perf_event; do
        mkdir -p $cg/$c
        mount -t cgroup -o nosuid,nodev,noexec,$c cgroup $cg/$c || fail "mount the v1 $c hierarchy"
    done
    ln -s cpu,cpuacct $cg/cpu
    ln -s cpu,cpuacct $cg/cpuacct
    ln -s net_cls,net_prio $cg/net_cls
    ln -s net_cls,net_prio $cg/net_prio
    mkdir -p $cg/unified
    mount -t cgroup2 -o nosuid,nodev,noexec,nsdelegate cgroup2 $cg/unified || fail "mount cgroup2 at unified"
elif [ "$init" = systemd ]; then
    : # systemd mounts cgroup2 itself and enables controllers as units ask
else
    mount -t cgroup2 -o nsdelegate cgroup2 $r/sys/fs/cgroup || fail "mount cgroup2"
    for c in cpu cpuset io memory pids hugetlb; do
        echo "+$c" >$r/sys/fs/cgroup/cgroup.subtree_control || fail "enable the $c controller"
    done
fi
mkdir -p "$r$work"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=none work "$r$work" ||
    fail "mount the work directory $work (9p tag work)"
release=$(uname -r)
mkdir -p "$r/lib/modules/$release"
mount --bind "$r$modules" "$r/lib/modules/$release" || fail "bind the modules $modules"
hostname petrel-vm
ip link set lo up

if [ "$init" = systemd ]; then
    # systemd as PID 1 with a target of its own (systemd.unit= on the
    # kernel command line): the agent as a service and the system bus
    # (runc's systemd driver and D-Bus clients talk to it), nothing the
    # host enables. DefaultDependencies=no everywhere: the defaults pull
    # in sysinit.target, and with it the host's fstab, udev and the rest.
    u=$r/etc/systemd/system
    mkdir -p $u
    rm -rf $u/petrel-vm.target $u/petrel-vm-agent.service $u/dbus.service $u/dbus.socket \
        $u/dbus.service.d $u/dbus.socket.d
    cat >$u/petrel-vm.target <<EOF
[Unit]
Description=Petrel test VM: the agent and the system bus
DefaultDependencies=no
Requires=petrel-vm-agent.service dbus.socket dbus.service
After=petrel-vm-agent.service dbus.service
EOF
    cat >$u/dbus.socket <<EOF
[Unit]
Description=D-Bus system bus socket (Petrel test VM)
DefaultDependencies=no
[Socket]
ListenStream=/run/dbus/system_bus_socket
EOF
    cat >$u/dbus.service <<EOF
[Unit]
Description=D-Bus system bus (Petrel test VM)
DefaultDependencies=no
Requires=dbus.socket
After=dbus.socket
[Service]
Type=notify
NotifyAccess=main
ExecStart=/usr/bin/dbus-daemon --system --address=systemd: --nofork --nopidfile --systemd-activation --syslog-only
EOF
    # The agent runs as root with its cgroup delegated, as a node's kubelet
    # and runtime services do: what it starts may make cgroups below it,
    # and through systemd (slices, scopes) anywhere. Nothing stops it while
    # the guest lives; the guest powers off when it ends.
    cat >$u/petrel-vm-agent.service <<EOF
[Unit]
Description=Petrel test VM agent
DefaultDependencies=no
After=dbus.service
[Service]
Type=simple
Environment=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
WorkingDirectory=/
ExecStartPre=-/bin/sh -c 'modprobe dummy && ip link add petrel0 type dummy && ip addr add 192.0.2.10/24 dev petrel0 && ip link set petrel0 up && ip route add default via 192.0.2.1 dev petrel0 || echo "petrel-vm: no node address on petrel0" >/dev/console'
ExecStart=$agent
ExecStopPost=/bin/sh -c 'echo "petrel-vm: the agent exited (\$\$EXIT_STATUS): powering off" >/dev/console'
StandardInput=null
StandardOutput=tty
StandardError=tty
TTYPath=/dev/console
Delegate=yes
TasksMax=infinity
LimitNOFILE=1048576
LimitNPROC=infinity
LimitCORE=infinity
OOMScoreAdjust=-999
SuccessAction=poweroff-force
FailureAction=poweroff-force
EOF
    # Not the host's identity: a machine id and a name of the guest's own.
    rm -f $r/etc/machine-id
    tr -d '-' <$r/proc/sys/kernel/random/uuid >$r/etc/machine-id
    echo petrel-vm >$r/etc/hostname
    # A host that is a container marks its root so (/.dockerenv): systemd
    # would believe it runs in one and ignore the kernel's command line.
    rm -f $r/.dockerenv $r/run/.containerenv
    exec switch_root $r /lib/systemd/systemd --unit=petrel-vm.target
    fail "switch_root to systemd"
fi

# Stage 2 lives on the new root's /run: busybox's poweroff needs no init.
mkdir -p $r/run/petrel-vm
cp /bin/busybox $r/run/petrel-vm/busybox
cat >$r/run/petrel-vm/init2 <<EOF
# Stage 2 (PID 1 after switch_root): the agent, and power off when it ends.
# PID 1's shell also reaps the orphans of the commands the agent runs.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root
cd /
# A node address on a dummy interface (TEST-NET-1, reaching nothing):
# kubelet refuses a node with loopback alone, and nothing here needs more.
modprobe dummy && ip link add petrel0 type dummy &&
    ip addr add 192.0.2.10/24 dev petrel0 && ip link set petrel0 up &&
    ip route add default via 192.0.2.1 dev petrel0 ||
    echo "petrel-vm: no node address on petrel0" >/dev/console
"$agent"
echo "petrel-vm: the agent exited (\$?): powering off" >/dev/console
/run/petrel-vm/busybox poweroff -f
EOF
exec switch_root $r /run/petrel-vm/busybox sh /run/petrel-vm/init2
fail "switch_root"
