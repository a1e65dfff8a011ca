#!/usr/bin/env bash
# Fetches containerd from Debian for the tests that run Petrel's agent
# against it, without installing anything (no package is configured, no
# service starts, the machine's apt sources and state are untouched):
#   build/containerd-1.7/   containerd 1.7.x from Debian trixie
#                           (GetContainerEvents, NRI)
#   build/containerd-1.6/   containerd 1.6.x from Debian bookworm
#                           (GetContainerEvents answers UNIMPLEMENTED)
#   build/cni-plugins/      Debian's containernetworking-plugins (bookworm)
# Each directory holds the package's files as `dpkg-deb -x` lays them out
# (usr/bin/containerd, usr/bin/containerd-shim-runc-v2, usr/bin/ctr,
# usr/lib/cni/bridge, ...) plus a VERSION file. The .debs are cached in
# build/debs/<suite> and apt's private lists in build/apt/<suite>.
# Does nothing for a directory that is already complete.
#
# Usage: scripts/containerd.sh [BUILD_DIR]   (default: build)
set -euo pipefail
shopt -s inherit_errexit

build=$(realpath -m "${1:-build}")
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
keyring=/usr/share/keyrings/debian-archive-keyring.gpg

# apt-get with a private sources list, lists and caches for one suite.
apt_private() {
    local suite=$1
    shift
    local dir=$build/apt/$suite
    apt-get -q \
        -o Dir::Etc::SourceList="$dir/sources.list" \
        -o Dir::Etc::SourceParts=/dev/null \
        -o Dir::State::Lists="$dir/lists" \
        -o Dir::Cache="$dir/cache" \
        -o Dir::Cache::archives="$dir/cache/archives" \
        -o Debug::NoLocking=true \
        -o APT::Sandbox::User=root \
        "$@"
}

# Downloads package $2 from suite $1 into build/debs/$1 (once) and prints
# its path.
download() {
    local suite=$1 pkg=$2 dir=$build/apt/$1 debs=$build/debs/$1 deb
    deb=$(find "$debs" -maxdepth 1 -name "${pkg}_*.deb" -print -quit 2>/dev/null || true)
    if [[ -n $deb ]]; then
        echo "$deb"
        return
    fi
    if [[ ! -f $dir/lists/.updated ]]; then
        mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial"
        echo "deb [signed-by=$keyring] $mirror $suite main" >"$dir/sources.list"
        apt_private "$suite" update >&2
        touch "$dir/lists/.updated"
    fi
    mkdir -p "$debs"
    (cd "$debs" && apt_private "$suite" download "$pkg/$suite" >&2)
    find "$debs" -maxdepth 1 -name "${pkg}_*.deb" -print -quit
}

# Extracts package $2 from suite $1 into $3 unless it is complete already
# (file $4 inside it exists).
fetch() {
    local suite=$1 pkg=$2 out=$3 probe=$4 deb tmp
    if [[ -x $out/$probe ]]; then
        echo "containerd.sh: $out is present ($(cat "$out/VERSION" 2>/dev/null || echo '?'))"
        return
    fi
    deb=$(download "$suite" "$pkg")
    if [[ -z $deb ]]; then
        echo "containerd.sh: no $pkg .deb downloaded from $suite" >&2
        exit 1
    fi
    tmp=$out.tmp.$$
    rm -rf "$tmp"
    dpkg-deb -x "$deb" "$tmp"
    dpkg-deb -f "$deb" Version >"$tmp/VERSION"
    rm -rf "$out"
    mv "$tmp" "$out"
    echo "containerd.sh: $pkg $(cat "$out/VERSION") from $suite in $out"
}

if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
    echo "containerd.sh: apt-get and dpkg-deb are needed (Debian)" >&2
    exit 1
fi
if [[ ! -f $keyring ]]; then
    echo "containerd.sh: $keyring missing (apt-get install debian-archive-keyring)" >&2
    exit 1
fi

fetch trixie containerd "$build/containerd-1.7" usr/bin/containerd
fetch bookworm containerd "$build/containerd-1.6" usr/bin/containerd
fetch bookworm containernetworking-plugins "$build/cni-plugins" usr/lib/cni/bridge
