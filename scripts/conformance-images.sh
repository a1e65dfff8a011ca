#!/usr/bin/env bash
# Builds the conformance kit's images: substitutes for every image critest
# (cri-tools) pulls, made from Debian bookworm packages only (.debs fetched
# with apt-get download through a private sources list, unpacked with
# dpkg-deb -x; two tiny C programs compiled with Debian's gcc), pushed into
# a docker-registry storage directory under the repository paths critest
# asks for (without the registry host: hosts.toml mirrors map
# registry.k8s.io, k8s.gcr.io, gcr.io, public.ecr.aws and docker.io to it).
#
# Output, cached outside the clone by a hash of this script:
#   $PETREL_CONFORMANCE_CACHE/<hash>/       (default /var/cache/petrel/conformance)
#     registry/     docker-registry filesystem storage (serve it read-only)
#     images.tsv    "<upstream reference>\t<manifest digest>\t<image id>"
#     oci/          the same images as one OCI image layout
# The last line printed on stdout is that directory. A second run finds it
# complete and does nothing; concurrent runs wait on a lock.
#
# Images (what critest's specs need of each):
#   busybox         Debian's dynamically linked busybox, applets as hard
#                   links in /bin, plus pgrep (procps) and ipcs (util-linux)
#                   with their libraries; /etc/passwd with www-data (33)
#   nginx           Debian's nginx as PID 1 ("nginx: master process"),
#                   pid file /var/run/nginx.pid, page on port 80
#   hostnet-nginx   the same, listening on 12003 (host network specs)
#   httpd           Debian's apache2 installed as /usr/local/apache2/bin/httpd,
#                   "It works!" on port 80, logs naming httpd
#   nonewprivs      a setuid-root program printing "Effective uid: N"
#   pause           a static pause program (sleeps, reaps, exits 0 on TERM)
#   test-image-*    busybox plus a file named by the tag (distinct images)
#   user images     busybox with USER 1002, www-data, 1003:1004, www-data:1004
#   predefined-group  busybox with default-user (1000) in group
#                   group-defined-in-image (50000), USER 1000
set -euo pipefail
shopt -s inherit_errexit

script=$(readlink -f "${BASH_SOURCE[0]}")
cache=${PETREL_CONFORMANCE_CACHE:-/var/cache/petrel/conformance}
hash=$(sha256sum "$script" | cut -c1-16)
out=$cache/$hash
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=bookworm
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
epoch=@0

log() { echo "conformance-images: $*" >&2; }
die() {
    log "$*"
    exit 1
}

if [[ -f $out/.complete ]]; then
    log "up to date in $out"
    echo "$out"
    exit 0
fi

for tool in apt-get dpkg-deb readelf gcc skopeo docker-registry sha256sum; do
    command -v "$tool" >/dev/null || die "$tool not found (make deps installs it)"
done
[[ -f $keyring ]] || die "$keyring missing (apt-get install debian-archive-keyring)"
[[ -f /usr/lib/x86_64-linux-gnu/libc.a ]] || die "libc.a missing (apt-get install libc6-dev)"

mkdir -p "$cache"
exec 9>"$cache/.build.lock"
flock 9
if [[ -f $out/.complete ]]; then
    log "built by another run in $out"
    echo "$out"
    exit 0
fi
started=$(date +%s)

work=$(mktemp -d "${TMPDIR:-/tmp}/petrel-conformance.XXXXXX")
registry_pid=
cleanup() {
    [[ -z $registry_pid ]] || kill "$registry_pid" 2>/dev/null || true
    [[ -z $registry_pid ]] || wait "$registry_pid" 2>/dev/null || true
    rm -rf "$work" "$out.tmp.$$"
}
trap cleanup EXIT

# --- Debian packages --------------------------------------------------------
packages=(
    # busybox image
    libc6 libgcc-s1 busybox procps libproc2-0 libsystemd0 libcap2 libgcrypt20
    libgpg-error0 liblz4-1 liblzma5 libzstd1 util-linux
    # nginx
    nginx libcrypt1 libpcre2-8-0 libssl3 zlib1g
    # httpd
    apache2-bin libapr1 libaprutil1 libuuid1 libexpat1
)

apt_dir=$cache/apt/$suite
debs=$cache/debs/$suite
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
apt_update() {
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
    echo "deb [signed-by=$keyring] $mirror $suite main" >"$apt_dir/sources.list"
    apt_private update >&2
    touch "$apt_dir/lists/.updated"
}
missing_debs() {
    local p
    for p in "${packages[@]}"; do
        compgen -G "$debs/${p}_*.deb" >/dev/null || echo "$p"
    done
}
mapfile -t need < <(missing_debs)
if ((${#need[@]})); then
    [[ -f $apt_dir/lists/.updated ]] || apt_update
    mkdir -p "$debs"
    # A point release can retire a version the lists name: refresh once.
    if ! (cd "$debs" && apt_private download "${need[@]/%//$suite}" >&2); then
        apt_update
        (cd "$debs" && apt_private download "${need[@]/%//$suite}" >&2) ||
            die "apt-get download of ${need[*]} from $suite failed"
    fi
fi
pkgs=$work/pkgs
mkdir -p "$pkgs"
for p in "${packages[@]}"; do
    deb=$(compgen -G "$debs/${p}_*.deb" | sort | tail -n 1)
    [[ -n $deb ]] || die "no .deb for $p in $debs"
    dpkg-deb -x "$deb" "$pkgs"
    printf '%s\t%s\n' "$p" "$(dpkg-deb -f "$deb" Version)" >>"$work/versions.tsv"
done

# --- rootfs helpers ---------------------------------------------------------
libdirs=(lib/x86_64-linux-gnu usr/lib/x86_64-linux-gnu lib64 usr/lib)

# Copies $1 (a path inside the packages, relative) into root $2, following
# a symlink to its target (which is copied too).
install_file() {
    local rel=$1 root=$2 target
    [[ -e $root/$rel || -L $root/$rel ]] && return 0
    [[ -e $pkgs/$rel || -L $pkgs/$rel ]] || die "$rel is in none of the packages"
    mkdir -p "$root/$(dirname "$rel")"
    cp -a "$pkgs/$rel" "$root/$rel"
    if [[ -L $pkgs/$rel ]]; then
        target=$(readlink "$pkgs/$rel")
        if [[ $target == /* ]]; then
            install_file "${target#/}" "$root"
        else
            install_file "$(dirname "$rel")/$target" "$root"
        fi
    fi
}

# Is $1 (relative) present in root $2 or in one of the lower roots $3..?
present() {
    local rel=$1 r
    shift
    for r in "$@"; do
        [[ -e $r/$rel || -L $r/$rel ]] && return 0
    done
    return 1
}

# Copies ELF file $1 into root $2 with every library it needs (recursively)
# that none of the lower roots $3.. holds; fails naming a library the
# packages do not have.
install_elf() {
    local rel=$1 root=$2 lib d found
    shift 2
    present "$rel" "$@" || install_file "$rel" "$root"
    while read -r lib; do
        found=
        for d in "${libdirs[@]}"; do
            if [[ -e $pkgs/$d/$lib ]]; then
                found=$d/$lib
                break
            fi
        done
        [[ -n $found ]] || die "$rel needs $lib, which the packages do not have"
        present "$found" "$root" "$@" || install_elf "$found" "$root" "$@"
    done < <(readelf -d "$pkgs/$rel" | sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p')
}

# Deterministic tar: sorted names, fixed owner and mtime, GNU format.
dtar() {
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="$epoch" \
        --format=gnu "$@"
}
sha() { sha256sum "$1" | cut -d' ' -f1; }
size() { stat -c %s "$1"; }

oci=$work/oci
mkdir -p "$oci/blobs/sha256"
declare -A layer_diff layer_digest layer_size

# Packs root $2 as layer $1 (gzip, into the layout's blobs).
layer() {
    local name=$1 root=$2 tarf=$work/layer-$1.tar
    find "$root" -type d -exec chmod u+rwx,go+rx {} +
    (cd "$root" && find . -mindepth 1 -maxdepth 1 -printf '%P\n' | LC_ALL=C sort |
        dtar -cf "$tarf" -T -)
    gzip -n -6 -c "$tarf" >"$tarf.gz"
    layer_diff[$name]=$(sha "$tarf")
    layer_digest[$name]=$(sha "$tarf.gz")
    layer_size[$name]=$(size "$tarf.gz")
    mv "$tarf.gz" "$oci/blobs/sha256/${layer_digest[$name]}"
    rm -f "$tarf"
}

path_env=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
manifests=()

# image NAME CONFIG LAYER...: an image whose config's "config" object is
# CONFIG (JSON members without braces), in the layout as ref name NAME.
image() {
    local name=$1 cfg=$2 diff_ids="" descs="" history="" l cfile mfile
    shift 2
    for l in "$@"; do
        diff_ids+="${diff_ids:+,}\"sha256:${layer_diff[$l]}\""
        descs+="${descs:+,}{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar+gzip\",\"digest\":\"sha256:${layer_digest[$l]}\",\"size\":${layer_size[$l]}}"
        history+="${history:+,}{\"created\":\"1970-01-01T00:00:00Z\",\"created_by\":\"scripts/conformance-images.sh: $l\"}"
    done
    cfile=$work/config-$name.json
    printf '{"architecture":"amd64","os":"linux","created":"1970-01-01T00:00:00Z","config":{%s},"rootfs":{"type":"layers","diff_ids":[%s]},"history":[%s]}' \
        "$cfg" "$diff_ids" "$history" >"$cfile"
    local cdigest
    cdigest=$(sha "$cfile")
    mfile=$work/manifest-$name.json
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[%s]}' \
        "$cdigest" "$(size "$cfile")" "$descs" >"$mfile"
    local mdigest
    mdigest=$(sha "$mfile")
    cp "$cfile" "$oci/blobs/sha256/$cdigest"
    cp "$mfile" "$oci/blobs/sha256/$mdigest"
    manifests+=("{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"sha256:$mdigest\",\"size\":$(size "$mfile"),\"platform\":{\"architecture\":\"amd64\",\"os\":\"linux\"},\"annotations\":{\"org.opencontainers.image.ref.name\":\"$name\"}}")
    printf '%s\tsha256:%s\tsha256:%s\n' "$name" "$mdigest" "$cdigest" >>"$work/built.tsv"
}

# --- busybox base -----------------------------------------------------------
base=$work/base
mkdir -p "$base"/{bin,etc,home,root,tmp,var,run,proc,sys,dev,usr/bin,usr/sbin,usr/local/bin}
install_elf lib64/ld-linux-x86-64.so.2 "$base"
install_elf bin/busybox "$base"
# glibc loads it at run time (pthread_cancel and pthread_exit): no NEEDED.
install_elf lib/x86_64-linux-gnu/libgcc_s.so.1 "$base"
ld_so=$pkgs/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
# Hard links, as the upstream busybox image has them: a shell that finds
# /bin/ls masked must fail to run it, not fall back to its own applet.
while read -r applet; do
    [[ -n $applet && $applet != busybox && ! -e $base/bin/$applet ]] || continue
    ln "$base/bin/busybox" "$base/bin/$applet"
done < <("$ld_so" --library-path "$pkgs/lib/x86_64-linux-gnu" "$pkgs/bin/busybox" --list)
install_elf usr/bin/pgrep "$base"
install_elf usr/bin/ipcs "$base"
ln -s ../run "$base/var/run"
printf '%s\n' \
    'root:x:0:0:root:/root:/bin/sh' \
    'daemon:x:1:1:daemon:/usr/sbin:/bin/false' \
    'bin:x:2:2:bin:/bin:/bin/false' \
    'sys:x:3:3:sys:/dev:/bin/false' \
    'sync:x:4:100:sync:/bin:/bin/sync' \
    'mail:x:8:8:mail:/var/spool/mail:/bin/false' \
    'www-data:x:33:33:www-data:/var/www:/bin/false' \
    'operator:x:37:37:Operator:/var:/bin/false' \
    'nobody:x:65534:65534:nobody:/home:/bin/false' >"$base/etc/passwd"
printf '%s\n' \
    'root:x:0:' 'daemon:x:1:' 'bin:x:2:' 'sys:x:3:' 'adm:x:4:' 'tty:x:5:' \
    'disk:x:6:' 'lp:x:7:' 'mail:x:8:' 'kmem:x:9:' 'wheel:x:10:root' \
    'www-data:x:33:' 'operator:x:37:' 'users:x:100:' 'nogroup:x:65534:' >"$base/etc/group"
printf '%s\n' 'passwd: files' 'group: files' 'shadow: files' 'hosts: files dns' >"$base/etc/nsswitch.conf"
chmod 0644 "$base"/etc/*
chmod 0700 "$base/root"
chmod 1777 "$base/tmp"
layer base "$base"

# --- the test-image files and user databases -------------------------------
for f in test-image-latest test-image-1 test-image-2 test-image-3 \
    test-image-digest test all same-image; do
    mkdir -p "$work/file-$f"
    : >"$work/file-$f/$f"
    chmod 0644 "$work/file-$f/$f"
    layer "file-$f" "$work/file-$f"
done
group_root=$work/predefined-group
mkdir -p "$group_root/etc" "$group_root/home/default-user"
{
    cat "$base/etc/passwd"
    echo 'default-user:x:1000:1000::/home/default-user:/bin/sh'
} >"$group_root/etc/passwd"
{
    cat "$base/etc/group"
    echo 'default-user:x:1000:'
    echo 'group-defined-in-image:x:50000:default-user'
} >"$group_root/etc/group"
chmod 0644 "$group_root"/etc/*
layer predefined-group "$group_root"

# --- nginx ------------------------------------------------------------------
nginx=$work/nginx
install_elf usr/sbin/nginx "$nginx" "$base"
mkdir -p "$nginx"/etc/nginx/conf.d "$nginx"/usr/share/nginx/html "$nginx"/var/log/nginx \
    "$nginx"/var/lib/nginx/{body,proxy,fastcgi,uwsgi,scgi}
cat >"$nginx/etc/nginx/nginx.conf" <<'EOF'
user www-data;
worker_processes 1;
pid /var/run/nginx.pid;
error_log /dev/stderr notice;
events { worker_connections 64; }
http {
    types { text/html html htm; text/plain txt; }
    default_type application/octet-stream;
    access_log /dev/stdout;
    sendfile on;
    include /etc/nginx/conf.d/*.conf;
}
EOF
nginx_site() {
    printf 'server {\n    listen %s;\n    server_name localhost;\n    location / {\n        root /usr/share/nginx/html;\n        index index.html;\n    }\n}\n' "$1"
}
nginx_site 80 >"$nginx/etc/nginx/conf.d/default.conf"
printf '<!DOCTYPE html>\n<html><head><title>Welcome to nginx!</title></head>\n<body><h1>Welcome to nginx!</h1></body></html>\n' \
    >"$nginx/usr/share/nginx/html/index.html"
chmod -R go+rX "$nginx"
layer nginx "$nginx"
hostnet=$work/hostnet-nginx
mkdir -p "$hostnet/etc/nginx/conf.d"
nginx_site 12003 >"$hostnet/etc/nginx/conf.d/default.conf"
chmod 0644 "$hostnet/etc/nginx/conf.d/default.conf"
layer hostnet-nginx "$hostnet"

# --- httpd (Debian's apache2 in the upstream image's layout) ----------------
httpd=$work/httpd
hroot=usr/local/apache2
mkdir -p "$httpd/$hroot"/{bin,conf,htdocs,logs,modules}
install_elf usr/sbin/apache2 "$httpd" "$base"
mv "$httpd/usr/sbin/apache2" "$httpd/$hroot/bin/httpd"
for m in mpm_event authz_core dir mime; do
    install_elf "usr/lib/apache2/modules/mod_$m.so" "$httpd" "$base"
    mv "$httpd/usr/lib/apache2/modules/mod_$m.so" "$httpd/$hroot/modules/"
done
rm -rf "$httpd/usr/lib/apache2"
cat >"$httpd/$hroot/conf/httpd.conf" <<'EOF'
ServerRoot "/usr/local/apache2"
Listen 80
LoadModule mpm_event_module modules/mod_mpm_event.so
LoadModule authz_core_module modules/mod_authz_core.so
LoadModule dir_module modules/mod_dir.so
LoadModule mime_module modules/mod_mime.so
User daemon
Group daemon
PidFile logs/httpd.pid
ErrorLog /proc/self/fd/2
LogLevel info
LogFormat "%h %l %u %t \"%r\" %>s %b" common
CustomLog /proc/self/fd/1 common
DocumentRoot "/usr/local/apache2/htdocs"
<Directory "/usr/local/apache2/htdocs">
    Require all granted
</Directory>
DirectoryIndex index.html
TypesConfig conf/mime.types
EOF
printf 'text/html\thtml htm\ntext/plain\ttxt\n' >"$httpd/$hroot/conf/mime.types"
printf '<html><body><h1>It works!</h1></body></html>\n' >"$httpd/$hroot/htdocs/index.html"
cat >"$httpd/$hroot/bin/httpd-foreground" <<'EOF'
#!/bin/sh
# Apache refuses to start over a pid file of a previous run.
rm -f /usr/local/apache2/logs/httpd.pid
exec httpd -d /usr/local/apache2 -f conf/httpd.conf -DFOREGROUND "$@"
EOF
chmod 0755 "$httpd/$hroot/bin/httpd-foreground"
chmod -R go+rX "$httpd"
layer httpd "$httpd"

# --- nonewprivs and pause: small static programs ----------------------------
cat >"$work/nnp.c" <<'EOF'
/* Prints the effective uid: 0 when the setuid bit took effect. */
#include <stdio.h>
#include <unistd.h>
int main(void) {
    printf("Effective uid: %d\n", (int)geteuid());
    return 0;
}
EOF
cat >"$work/pause.c" <<'EOF'
/* A pod's first process: sleeps, reaps adopted children, exits 0 on
 * SIGINT or SIGTERM. */
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
static void quit(int sig) { (void)sig; _exit(0); }
static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {}
}
int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = quit;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sa.sa_handler = reap;
    sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigaction(SIGCHLD, &sa, NULL);
    for (;;) pause();
}
EOF
nnp=$work/nnp
mkdir -p "$nnp/usr/local/bin"
gcc -static -O2 -s -o "$nnp/usr/local/bin/nnp" "$work/nnp.c"
chmod 4755 "$nnp/usr/local/bin/nnp"
layer nonewprivs "$nnp"
pause=$work/pause
mkdir -p "$pause"
gcc -static -O2 -s -o "$pause/pause" "$work/pause.c"
chmod 0755 "$pause/pause"
layer pause "$pause"

# --- images -----------------------------------------------------------------
env_cfg="\"Env\":[\"$path_env\"]"
image busybox "$env_cfg,\"Cmd\":[\"sh\"]" base
image nginx "$env_cfg,\"Cmd\":[\"nginx\",\"-g\",\"daemon off;\"],\"ExposedPorts\":{\"80/tcp\":{}}" base nginx
image hostnet-nginx "$env_cfg,\"Cmd\":[\"nginx\",\"-g\",\"daemon off;\"],\"ExposedPorts\":{\"12003/tcp\":{}}" base nginx hostnet-nginx
image httpd "\"Env\":[\"PATH=/usr/local/apache2/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\",\"HTTPD_PREFIX=/usr/local/apache2\"],\"Cmd\":[\"httpd-foreground\"],\"WorkingDir\":\"/usr/local/apache2\",\"ExposedPorts\":{\"80/tcp\":{}}" base httpd
image nonewprivs "$env_cfg,\"Cmd\":[\"/usr/local/bin/nnp\"]" base nonewprivs
image pause "$env_cfg,\"Entrypoint\":[\"/pause\"]" pause
for f in test-image-latest test-image-1 test-image-2 test-image-3 test-image-digest; do
    image "$f" "$env_cfg,\"Cmd\":[\"sh\"]" base "file-$f"
done
image test-image-tag-test "$env_cfg,\"Cmd\":[\"sh\"]" base file-test
image test-image-tag-all "$env_cfg,\"Cmd\":[\"sh\"]" base file-all
image test-image-tags "$env_cfg,\"Cmd\":[\"sh\"]" base file-same-image
image user-uid "$env_cfg,\"Cmd\":[\"sh\"],\"User\":\"1002\"" base
image user-username "$env_cfg,\"Cmd\":[\"sh\"],\"User\":\"www-data\"" base
image user-uid-group "$env_cfg,\"Cmd\":[\"sh\"],\"User\":\"1003:1004\"" base
image user-username-group "$env_cfg,\"Cmd\":[\"sh\"],\"User\":\"www-data:1004\"" base
image predefined-group "$env_cfg,\"Cmd\":[\"sh\"],\"User\":\"1000\"" base predefined-group

printf '{"imageLayoutVersion":"1.0.0"}' >"$oci/oci-layout"
(
    IFS=,
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[%s]}' "${manifests[*]}"
) >"$oci/index.json"

# Where each image goes: "<layout ref name> <upstream reference>...". The
# registry path drops the upstream host (the mirror serves every host).
cri=gcr.io/k8s-staging-cri-tools
e2e=registry.k8s.io/e2e-test-images
ecr=public.ecr.aws/docker/library
destinations=(
    "busybox $e2e/busybox:1.29-2 $ecr/busybox:1.35.0-glibc $ecr/busybox:1-uclibc $ecr/busybox:1 $ecr/busybox:1-glibc $ecr/busybox:1-musl"
    "nginx $e2e/nginx:1.14-2"
    "hostnet-nginx $cri/hostnet-nginx-amd64:latest"
    "httpd $e2e/httpd:2.4.39-4"
    "nonewprivs $e2e/nonewprivs:1.3"
    "pause registry.k8s.io/pause:3.9 k8s.gcr.io/pause:3.9"
    "test-image-latest $cri/test-image-latest:latest"
    "test-image-1 $cri/test-image-1:latest"
    "test-image-2 $cri/test-image-2:latest"
    "test-image-3 $cri/test-image-3:latest"
    "test-image-digest $cri/test-image-digest:latest"
    "test-image-tag-test $cri/test-image-tag:test"
    "test-image-tag-all $cri/test-image-tag:all"
    "test-image-tags $cri/test-image-tags:1 $cri/test-image-tags:2 $cri/test-image-tags:3"
    "user-uid $cri/test-image-user-uid:latest"
    "user-username $cri/test-image-user-username:latest"
    "user-uid-group $cri/test-image-user-uid-group:latest"
    "user-username-group $cri/test-image-user-username-group:latest"
    "predefined-group $cri/test-image-predefined-group:latest"
)

# --- push into a registry storage -------------------------------------------
tmp_out=$out.tmp.$$
mkdir -p "$tmp_out"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat >"$work/registry.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $tmp_out/registry
http:
  addr: 127.0.0.1:$port
EOF
docker-registry serve "$work/registry.yml" >"$work/registry.log" 2>&1 &
registry_pid=$!
for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    kill -0 "$registry_pid" 2>/dev/null || die "docker-registry exited: $(cat "$work/registry.log")"
    sleep 0.1
done
: >"$tmp_out/images.tsv"
: >"$work/pushes"
for line in "${destinations[@]}"; do
    read -r name refs <<<"$line"
    row=$(grep -P "^\Q$name\E\t" "$work/built.tsv") || die "no image $name was built"
    for ref in $refs; do
        printf '%s %s\n' "$name" "${ref#*/}" >>"$work/pushes"
        printf '%s\t%s\n' "$ref" "$(cut -f2- <<<"$row")" >>"$tmp_out/images.tsv"
    done
done
# Four at a time: each push mostly waits on the registry.
# shellcheck disable=SC2016
xargs -P 4 -L 1 sh -c 'skopeo copy --quiet --insecure-policy --preserve-digests \
    --dest-tls-verify=false "oci:$0:$1" "docker://$2/$3" || { echo "pushing $1 as $3 failed" >&2; exit 255; }' \
    "$oci" <<<"$(sed "s|^\([^ ]*\) |\1 127.0.0.1:$port |" "$work/pushes")" ||
    die "pushing into the registry failed; registry log: $(tail -n 5 "$work/registry.log")"
kill "$registry_pid"
wait "$registry_pid" 2>/dev/null || true
registry_pid=
cp -a "$oci" "$tmp_out/oci"
cp "$work/versions.tsv" "$tmp_out/packages.tsv"
touch "$tmp_out/.complete"
rm -rf "$out"
mv "$tmp_out" "$out"
log "built $(wc -l <"$out/images.tsv") references in $(($(date +%s) - started)) s in $out"
echo "$out"
