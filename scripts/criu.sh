#!/usr/bin/env bash
# Fetches CRIU (checkpoint/restore, for CRI CheckpointContainer and restore
# from a checkpoint archive) from Debian trixie without installing anything:
#   build/criu/root/   criu 4.1 and every library it links, trixie's glibc
#                      included, as `dpkg-deb -x` lays them out
#   build/criu/criu    a wrapper that runs root/usr/sbin/criu with trixie's
#                      own dynamic loader and libraries: trixie's criu needs
#                      glibc >= 2.38 and bookworm has 2.36, so the host's
#                      libraries cannot serve it
#   build/criu/VERSION the criu package's version
# The .debs are cached in build/debs/trixie and apt's private lists in
# build/apt/trixie (shared with scripts/containerd.sh). Does nothing when
# build/criu is complete.
#
# Usage: scripts/criu.sh [BUILD_DIR]   (default: build)
set -euo pipefail
shopt -s inherit_errexit

build=$(realpath -m "${1:-build}")
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
suite=trixie
out=$build/criu
apt_dir=$build/apt/$suite
debs=$build/debs/$suite

# criu's run-time dependency closure in trixie (`apt-cache depends --recurse
# --no-recommends ... criu`, packages only); kept explicit so the set of
# files unpacked is known and no resolver state is needed.
packages=(criu libcompel1 libc6 gcc-14-base libgcc-s1 libbsd0 libmd0
    libgnutls30t64 libgmp10 libhogweed6t64 libnettle8t64 libidn2-0 libunistring5
    libp11-kit0 libffi8 libtasn1-6 libnet1 libnftables1 libjansson4 libmnl0
    libnftnl11 libxtables12 libnl-3-200 libprotobuf-c1 libuuid1)

apt_private() {
    apt-get -q \
        -o Dir::Etc::SourceList="$apt_dir/sources.list" \
        -o Dir::Etc::SourceParts=/dev/null \
        -o Dir::State::Lists="$apt_dir/lists" \
        -o Dir::Cache="$apt_dir/cache" \
        -o Dir::Cache::archives="$apt_dir/cache/archives" \
        -o Debug::NoLocking=true \
        -o APT::Sandbox::User=root \
        "$@"
}

if [[ -x $out/criu && -f $out/VERSION ]]; then
    echo "criu.sh: $out is present ($(cat "$out/VERSION"))"
    exit 0
fi
if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
    echo "criu.sh: apt-get and dpkg-deb are needed (Debian)" >&2
    exit 1
fi

if [[ ! -f $apt_dir/lists/.updated ]]; then
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
    echo "deb [signed-by=$keyring] $mirror $suite main" >"$apt_dir/sources.list"
    apt_private update >&2
    touch "$apt_dir/lists/.updated"
fi
mkdir -p "$debs"
need=()
for pkg in "${packages[@]}"; do
    if [[ -z $(find "$debs" -maxdepth 1 -name "${pkg}_*.deb" -print -quit) ]]; then
        need+=("$pkg/$suite")
    fi
done
if ((${#need[@]} > 0)); then
    (cd "$debs" && apt_private download "${need[@]}" >&2)
fi

tmp=$out.tmp.$$
rm -rf "$tmp"
mkdir -p "$tmp/root"
for pkg in "${packages[@]}"; do
    deb=$(find "$debs" -maxdepth 1 -name "${pkg}_*.deb" -print -quit)
    if [[ -z $deb ]]; then
        echo "criu.sh: no $pkg .deb downloaded from $suite" >&2
        exit 1
    fi
    dpkg-deb -x "$deb" "$tmp/root"
    if [[ $pkg == criu ]]; then
        dpkg-deb -f "$deb" Version >"$tmp/VERSION"
    fi
done
# The wrapper resolves its own directory so build/ may be a symlink or move.
cat >"$tmp/criu" <<'EOF'
#!/bin/sh
# criu from Debian trixie, run with trixie's loader and libraries (see
# scripts/criu.sh); nothing of it is installed on the host.
here=$(dirname "$(readlink -f "$0")")/root
lib=$here/usr/lib/x86_64-linux-gnu
exec "$lib/ld-linux-x86-64.so.2" --library-path "$lib" --argv0 criu \
    "$here/usr/sbin/criu" "$@"
EOF
chmod 755 "$tmp/criu"
"$tmp/criu" --version >/dev/null
rm -rf "$out"
mv "$tmp" "$out"
echo "criu.sh: criu $(cat "$out/VERSION") from $suite in $out"
