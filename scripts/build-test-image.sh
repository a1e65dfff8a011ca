#!/usr/bin/env bash
# Builds Petrel's busybox test image from Debian's static /bin/busybox
# (package busybox-static), without network, as two archives in $1
# (default build/images):
#   busybox-oci.tar     OCI image layout, ref name docker.io/petrel/busybox:latest
#   busybox-docker.tar  the same image as a docker archive, tagged
#                       docker.io/petrel/busybox:docker
#   pause-oci.tar       OCI image layout, ref name docker.io/petrel/pause:latest:
#                       the same layer, with an entrypoint that sleeps as PID 1
#                       and exits 0 on SIGTERM or SIGINT (containerd's sandbox
#                       image in the tests against containerd)
# Both are deterministic (fixed mtimes and owners, sorted entries, gzip -n),
# so the image id and digests only change with /bin/busybox or this script.
# Does nothing when both outputs are newer than /bin/busybox and this script.
set -euo pipefail

# Absolute: the script changes directory while it builds.
out=$(realpath -m "${1:-build/images}")
busybox=${BUSYBOX:-/bin/busybox}
script=$(readlink -f "${BASH_SOURCE[0]}")
ref_name=docker.io/petrel/busybox:latest
docker_tag=docker.io/petrel/busybox:docker
pause_ref_name=docker.io/petrel/pause:latest
epoch=@0

if [[ ! -x $busybox ]]; then
    echo "build-test-image: $busybox not found (apt-get install busybox-static)" >&2
    exit 1
fi

oci_tar=$out/busybox-oci.tar
docker_tar=$out/busybox-docker.tar
pause_tar=$out/pause-oci.tar
up_to_date() {
    local f
    for f in "$oci_tar" "$docker_tar" "$pause_tar"; do
        [[ -f $f && $f -nt $busybox && $f -nt $script ]] || return 1
    done
}
if up_to_date; then
    echo "build-test-image: $out is up to date"
    exit 0
fi

mkdir -p "$out"
work=$(mktemp -d "${TMPDIR:-/tmp}/petrel-test-image.XXXXXX")
trap 'rm -rf "$work" "$oci_tar.tmp.$$" "$docker_tar.tmp.$$" "$pause_tar.tmp.$$"' EXIT

# Deterministic tar: sorted names, fixed owner and mtime, GNU format (no
# PAX atime/ctime records).
dtar() {
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="$epoch" \
        --format=gnu "$@"
}
sha() { sha256sum "$1" | cut -d' ' -f1; }
size() { stat -c %s "$1"; }

# --- root filesystem -------------------------------------------------------
rootfs=$work/rootfs
mkdir -p "$rootfs"/{bin,etc,tmp,root,home,var}
cp "$busybox" "$rootfs/bin/busybox"
chmod 0755 "$rootfs/bin/busybox"
while read -r applet; do
    [[ -n $applet && $applet != busybox ]] || continue
    ln -s busybox "$rootfs/bin/$applet"
done < <("$busybox" --list)
printf '%s\n' \
    'root:x:0:0:root:/root:/bin/sh' \
    'nobody:x:65534:65534:nobody:/nonexistent:/bin/false' >"$rootfs/etc/passwd"
printf '%s\n' 'root:x:0:' 'nogroup:x:65534:' >"$rootfs/etc/group"
chmod 0644 "$rootfs/etc/passwd" "$rootfs/etc/group"
chmod 0755 "$rootfs"/{bin,etc,home,var}
chmod 0700 "$rootfs/root"
chmod 1777 "$rootfs/tmp"

layer_tar=$work/layer.tar
(cd "$rootfs" && dtar -cf "$layer_tar" bin etc home root tmp var)
gzip -n -9 -c "$layer_tar" >"$work/layer.tar.gz"
diff_id=$(sha "$layer_tar")
layer_digest=$(sha "$work/layer.tar.gz")
layer_size=$(size "$work/layer.tar.gz")

# --- config, manifest, index ----------------------------------------------
path_env=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
printf '{"architecture":"amd64","os":"linux","created":"1970-01-01T00:00:00Z","config":{"Env":["%s"],"Cmd":["sh"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created":"1970-01-01T00:00:00Z","created_by":"scripts/build-test-image.sh"}]}' \
    "$path_env" "$diff_id" >"$work/config.json"
config_digest=$(sha "$work/config.json")
config_size=$(size "$work/config.json")

printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
    "$config_digest" "$config_size" "$layer_digest" "$layer_size" >"$work/manifest.json"
manifest_digest=$(sha "$work/manifest.json")
manifest_size=$(size "$work/manifest.json")

# --- OCI image layout -----------------------------------------------------
oci=$work/oci
mkdir -p "$oci/blobs/sha256"
cp "$work/layer.tar.gz" "$oci/blobs/sha256/$layer_digest"
cp "$work/config.json" "$oci/blobs/sha256/$config_digest"
cp "$work/manifest.json" "$oci/blobs/sha256/$manifest_digest"
printf '{"imageLayoutVersion":"1.0.0"}' >"$oci/oci-layout"
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"org.opencontainers.image.ref.name":"%s"}}]}' \
    "$manifest_digest" "$manifest_size" "$ref_name" >"$oci/index.json"
find "$oci" -type d -exec chmod 0755 {} +
find "$oci" -type f -exec chmod 0644 {} +
(cd "$oci" && dtar -cf "$oci_tar.tmp.$$" oci-layout index.json blobs)

# --- pause image: the same layer, another config --------------------------
# A trap makes the shell (PID 1 of the sandbox) exit on TERM/INT; `wait`
# returns as soon as a trapped signal arrives.
pause_cmd="trap 'exit 0' TERM INT; while :; do sleep 3600 & wait; done"
printf '{"architecture":"amd64","os":"linux","created":"1970-01-01T00:00:00Z","config":{"Env":["%s"],"Entrypoint":["/bin/sh","-c","%s"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created":"1970-01-01T00:00:00Z","created_by":"scripts/build-test-image.sh"}]}' \
    "$path_env" "$pause_cmd" "$diff_id" >"$work/pause-config.json"
pause_config_digest=$(sha "$work/pause-config.json")
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
    "$pause_config_digest" "$(size "$work/pause-config.json")" "$layer_digest" "$layer_size" >"$work/pause-manifest.json"
pause_manifest_digest=$(sha "$work/pause-manifest.json")
pause=$work/pause
mkdir -p "$pause/blobs/sha256"
cp "$work/layer.tar.gz" "$pause/blobs/sha256/$layer_digest"
cp "$work/pause-config.json" "$pause/blobs/sha256/$pause_config_digest"
cp "$work/pause-manifest.json" "$pause/blobs/sha256/$pause_manifest_digest"
printf '{"imageLayoutVersion":"1.0.0"}' >"$pause/oci-layout"
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"org.opencontainers.image.ref.name":"%s"}}]}' \
    "$pause_manifest_digest" "$(size "$work/pause-manifest.json")" "$pause_ref_name" >"$pause/index.json"
find "$pause" -type d -exec chmod 0755 {} +
find "$pause" -type f -exec chmod 0644 {} +
(cd "$pause" && dtar -cf "$pause_tar.tmp.$$" oci-layout index.json blobs)

# --- docker archive (docker save, classic layout) -------------------------
docker=$work/docker
mkdir -p "$docker/$diff_id"
cp "$layer_tar" "$docker/$diff_id/layer.tar"
printf '1.0' >"$docker/$diff_id/VERSION"
printf '{"id":"%s"}' "$diff_id" >"$docker/$diff_id/json"
cp "$work/config.json" "$docker/$config_digest.json"
printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' \
    "$config_digest" "$docker_tag" "$diff_id" >"$docker/manifest.json"
printf '{"%s":{"%s":"%s"}}' "${docker_tag%:*}" "${docker_tag##*:}" "$diff_id" >"$docker/repositories"
find "$docker" -type d -exec chmod 0755 {} +
find "$docker" -type f -exec chmod 0644 {} +
(cd "$docker" && dtar -cf "$docker_tar.tmp.$$" manifest.json repositories "$config_digest.json" "$diff_id")

# Replace the outputs atomically (the temp files sit beside them).
mv -f "$oci_tar.tmp.$$" "$oci_tar"
mv -f "$docker_tar.tmp.$$" "$docker_tar"
mv -f "$pause_tar.tmp.$$" "$pause_tar"
echo "build-test-image: image sha256:$config_digest (manifest sha256:$manifest_digest) in $out"
