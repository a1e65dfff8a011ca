#!/usr/bin/env bash
# `make peers`: builds the real Kubernetes components Petrel is tested
# against ("peers") from Go modules, with this machine's Go and the Go module
# proxy, at the versions in tools/peers/versions.env:
#
#   kubernetes  kube-apiserver kubelet kubectl kube-controller-manager
#               kube-scheduler (one `go build`: they share its compile)
#   etcd        etcd etcdctl
#   cri-tools   crictl critest
#   containerd  containerd containerd-shim-runc-v2 ctr
#   runc        runc (with Debian's libseccomp; for idmapped-mount tests)
#   controller-runtime
#               podset-controller (our sample controller on controller-runtime,
#               the reference of the controller kit's benchmark) and leader-elect
#               (leader-elect/main.go: a plain client-go leader-election
#               candidate for the kit's tests), one module, one client-go
#
# Each component is its own Go module (tools/peers/<component>/go.mod and
# go.sum, committed), so their dependency graphs never meet.
#
# Binaries are cached outside the clone, one directory per component, version
# and build recipe:
#   $PETREL_PEERS_CACHE/<component>-<version>-<key>/<binary>   (+ BUILD-INFO)
#   $PETREL_PEERS_CACHE/logs/<component>-<version>.log          (last build's log)
# where PETREL_PEERS_CACHE defaults to /var/cache/petrel/peers and <key> is
# the first 12 hex digits of a sha256 over the component's go.mod, go.sum and
# .go files, the build function below, the Go version and GOOS/GOARCH. A
# directory that exists is complete (it is renamed into place at the end), so
# a second run, another clone on this machine or CI rebuild nothing until a
# version or recipe changes. Go's own caches (GOMODCACHE, GOCACHE) stay where
# the environment puts them (~/go/pkg/mod, ~/.cache/go-build by default).
#
# build/peers/bin/<binary> in the clone is a symlink into the cache; tests
# find binaries through PETREL_PEERS_BIN (the Makefile sets it to that
# directory) or per binary through PETREL_PEER_<NAME> (upper case, '-' -> '_',
# e.g. PETREL_PEER_KUBELET=/path/kubelet). See README.md, "Peers".
#
# PETREL_PEERS_SKIP=containerd,runc (component names, comma or space
# separated) leaves components out: they are neither built nor linked, and
# tests that need them skip saying so. A component that fails to build makes
# the run fail with one line naming it, the command and its log.
#
# Usage: scripts/peers.sh [build]     build what is missing, link, verify versions
#        scripts/peers.sh check       go.mod files agree with versions.env (no network)
#        scripts/peers.sh pin         rewrite the go.mod/go.sum files from versions.env
#        scripts/peers.sh path NAME   print the binary tests would use for NAME
#        scripts/peers.sh smoke       start etcd and kube-apiserver on loopback, probe
#                                     them, run each binary's --version, stop them
set -euo pipefail
shopt -s inherit_errexit

root=$(cd "$(dirname "$0")/.." && pwd)
peers_dir=$root/tools/peers
# shellcheck source=tools/peers/versions.env
source "$peers_dir/versions.env"

components=(runc etcd cri-tools containerd kubernetes controller-runtime)
declare -A binaries=(
    [kubernetes]="kube-apiserver kubelet kubectl kube-controller-manager kube-scheduler"
    [etcd]="etcd etcdctl"
    [cri-tools]="crictl critest"
    [containerd]="containerd containerd-shim-runc-v2 ctr"
    [runc]="runc"
    [controller-runtime]="podset-controller leader-elect"
)
declare -A version=(
    [kubernetes]=$KUBERNETES_VERSION
    [etcd]=$ETCD_VERSION
    [cri-tools]=$CRI_TOOLS_VERSION
    [containerd]=$CONTAINERD_VERSION
    [runc]=$RUNC_VERSION
    [controller-runtime]=$CONTROLLER_RUNTIME_VERSION
)
# The modules each component's go.mod must require at its version.
declare -A modules=(
    [kubernetes]="k8s.io/kubernetes"
    [etcd]="go.etcd.io/etcd/server/v3 go.etcd.io/etcd/etcdctl/v3"
    [cri-tools]="sigs.k8s.io/cri-tools"
    [containerd]="github.com/containerd/containerd/v2"
    [runc]="github.com/opencontainers/runc"
    [controller-runtime]="sigs.k8s.io/controller-runtime"
)

cache=${PETREL_PEERS_CACHE:-/var/cache/petrel/peers}
skip_list=${PETREL_PEERS_SKIP:-}
bin_dir=$root/build/peers/bin

# The machine's Go: PATH first, then where the machine kind installs it.
if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then
    PATH=/usr/local/go/bin:$PATH
fi
# Never let a go.mod switch to a downloaded toolchain behind our back; a
# caller may still ask for one explicitly (GOTOOLCHAIN=go1.27.3).
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}
# A go.work above the clone must not join these modules; go.sum is complete.
export GOWORK=off GOFLAGS="-mod=readonly -buildvcs=false"

die() {
    echo "peers: $*" >&2
    exit 1
}

# --- go.mod parsing (no network) --------------------------------------------

# The version module $2 is required at in go.mod $1 (empty if not required).
required_version() {
    go mod edit -print "$1" | awk -v m="$2" '
        /^require \($/ { block = 1; next }
        block && /^\)$/ { block = 0; next }
        block && $1 == m { print $2; exit }
        $1 == "require" && $2 == m { print $3; exit }'
}

# "module version" for every replace in go.mod $1 that names a version.
replacements() {
    go mod edit -print "$1" | awk '
        /^replace \($/ { block = 1; next }
        block && /^\)$/ { block = 0; next }
        block && $2 == "=>" && NF == 4 { print $1, $4 }
        $1 == "replace" && $3 == "=>" && NF == 5 { print $2, $5 }'
}

# Fails, naming every mismatch, unless each go.mod requires what versions.env says.
check_pins() {
    local c m got bad=0 gomod
    for c in "${components[@]}"; do
        gomod=$peers_dir/$c/go.mod
        [[ -f $gomod ]] || { echo "peers: $gomod is missing (scripts/peers.sh pin)" >&2; bad=1; continue; }
        for m in ${modules[$c]}; do
            got=$(required_version "$gomod" "$m")
            if [[ $got != "${version[$c]}" ]]; then
                echo "peers: $gomod requires $m ${got:-(nothing)}, versions.env says ${version[$c]} (scripts/peers.sh pin)" >&2
                bad=1
            fi
        done
    done
    # The staging replacements: one line for all of them.
    local n=0 wrong=()
    while read -r m got; do
        [[ $m == k8s.io/* ]] || continue
        n=$((n + 1))
        [[ $got == "$KUBERNETES_STAGING_VERSION" ]] || wrong+=("$m@$got")
    done < <(replacements "$peers_dir/kubernetes/go.mod")
    if ((n == 0 || ${#wrong[@]} > 0)); then
        echo "peers: $peers_dir/kubernetes/go.mod must replace each k8s.io staging module with its $KUBERNETES_STAGING_VERSION tag (versions.env); it replaces $n, ${#wrong[@]} otherwise (${wrong[*]:0:3}...) (scripts/peers.sh pin)" >&2
        bad=1
    fi
    return $bad
}

# --- pin: go.mod/go.sum from versions.env (uses the network) ----------------

# Starts go.mod in the current directory afresh for module petrel.test/peers/$1.
new_gomod() {
    rm -f go.mod go.sum
    printf 'module petrel.test/peers/%s\n\ngo 1.26.0\n' "$1" >go.mod
}

pin() {
    local c
    (
        cd "$peers_dir/kubernetes"
        new_gomod kubernetes
        go mod edit -require="k8s.io/kubernetes@$KUBERNETES_VERSION"
        # The staging modules are exactly those upstream replaces with ./staging.
        local upstream staging
        upstream=$(go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
        [[ -f $upstream ]] || die "no go.mod downloaded for k8s.io/kubernetes@$KUBERNETES_VERSION"
        for staging in $(replacements_local "$upstream"); do
            go mod edit -replace="$staging=$staging@$KUBERNETES_STAGING_VERSION"
        done
        for c in ${binaries[kubernetes]}; do go mod edit -tool="k8s.io/kubernetes/cmd/$c"; done
        go mod tidy
    )
    (
        cd "$peers_dir/etcd"
        new_gomod etcd
        go mod edit -require="go.etcd.io/etcd/server/v3@$ETCD_VERSION" -require="go.etcd.io/etcd/etcdctl/v3@$ETCD_VERSION" \
            -tool=go.etcd.io/etcd/server/v3 -tool=go.etcd.io/etcd/etcdctl/v3
        go mod tidy
    )
    (
        # critest_deps.go (kept) names the packages critest's test binary imports.
        cd "$peers_dir/cri-tools"
        new_gomod cri-tools
        go mod edit -require="sigs.k8s.io/cri-tools@$CRI_TOOLS_VERSION" -tool=sigs.k8s.io/cri-tools/cmd/crictl
        go mod tidy
    )
    (
        cd "$peers_dir/containerd"
        new_gomod containerd
        go mod edit -require="github.com/containerd/containerd/v2@$CONTAINERD_VERSION"
        for c in ${binaries[containerd]}; do go mod edit -tool="github.com/containerd/containerd/v2/cmd/$c"; done
        go mod tidy
    )
    (
        cd "$peers_dir/runc"
        new_gomod runc
        go mod edit -require="github.com/opencontainers/runc@$RUNC_VERSION" -tool=github.com/opencontainers/runc
        go mod tidy
    )
    (
        # Our own program (*.go, kept): only its go.mod/go.sum are rewritten.
        cd "$peers_dir/controller-runtime"
        new_gomod controller-runtime
        # client-go and its kin at the cluster's own version (also lets Go's
        # build cache share them with the kubernetes build).
        go mod edit -require="sigs.k8s.io/controller-runtime@$CONTROLLER_RUNTIME_VERSION" \
            -require="k8s.io/api@$KUBERNETES_STAGING_VERSION" \
            -require="k8s.io/apimachinery@$KUBERNETES_STAGING_VERSION" \
            -require="k8s.io/client-go@$KUBERNETES_STAGING_VERSION"
        go mod tidy
    )
    check_pins
    echo "peers: go.mod and go.sum under $peers_dir rewritten from versions.env"
}

# The modules upstream's go.mod $1 replaces with a local directory.
replacements_local() {
    go mod edit -print "$1" | awk '
        /^replace \($/ { block = 1; next }
        block && /^\)$/ { block = 0; next }
        block && $2 == "=>" && $3 ~ /^\./ { print $1 }
        $1 == "replace" && $3 == "=>" && $4 ~ /^\./ { print $2 }'
}

# --- build recipes ------------------------------------------------------------
# Each runs in tools/peers/<component> and writes its binaries into $1. A
# change to one of these functions changes that component's cache key.
# They run without errexit (a failure must not end the other builds), so
# every step ends in `|| return`; `run` records the command for the report.

run() {
    local a prev="" short=""
    for a in "$@"; do
        if [[ $prev == -ldflags ]]; then short+="… "; else short+="$(printf '%q' "$a") "; fi
        prev=$a
    done
    echo "+ $(printf '%q ' "$@")"
    printf '%q ' "$@" >>"$cmd_file"
    echo >>"$cmd_file"
    # The failure line names the command without its (long) -ldflags value.
    echo "${short% }" >"$cmd_file.last"
    "$@"
}

build_kubernetes() {
    local out=$1 minor date ld="" pkg pkgs=()
    minor=${KUBERNETES_VERSION#v1.}
    minor=${minor%%.*}
    # The release's publication time, so that the binary does not depend on
    # when it was built.
    date=$(go list -m -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' k8s.io/kubernetes) || return
    # Kubernetes' own version stamps (hack/lib/version.sh), so that
    # `kubelet --version` reports the release; no git commit is known here.
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ld+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
        ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
    done
    for pkg in ${binaries[kubernetes]}; do pkgs+=("k8s.io/kubernetes/cmd/$pkg"); done
    # One invocation, so the five programs share every compiled package.
    # Upstream's release tags (selinux, notest, grpcnotrace); everything
    # static (upstream links kubelet with cgo only for its resolver).
    run env CGO_ENABLED=0 go build -trimpath -tags selinux,notest,grpcnotrace \
        -ldflags "$ld -s -w" -o "$out/" "${pkgs[@]}" || return
}

build_etcd() {
    local out=$1
    run env CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/" \
        go.etcd.io/etcd/server/v3 go.etcd.io/etcd/etcdctl/v3 || return
    # go names the server's binary after its package directory.
    run mv "$out/server" "$out/etcd" || return
}

build_cri_tools() {
    local out=$1 ld="-X sigs.k8s.io/cri-tools/pkg/version.Version=${CRI_TOOLS_VERSION#v} -s -w"
    run env CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$out/crictl" sigs.k8s.io/cri-tools/cmd/crictl || return
    # critest is upstream's ginkgo suite compiled as a test binary.
    run env CGO_ENABLED=0 go test -c -trimpath -ldflags "$ld" -o "$out/critest" sigs.k8s.io/cri-tools/cmd/critest || return
}

build_containerd() {
    local out=$1 p=github.com/containerd/containerd/v2
    local ld="-X $p/version.Version=$CONTAINERD_VERSION -X $p/version.Package=$p -s -w"
    # No cgo: the btrfs snapshotter (needs libbtrfs headers) drops out, as
    # no_btrfs says; upstream's tags otherwise.
    run env CGO_ENABLED=0 go build -trimpath -tags "urfave_cli_no_docs no_btrfs" -ldflags "$ld" \
        -o "$out/" "$p/cmd/containerd" "$p/cmd/ctr" || return
    # The shim as upstream ships it: static, without gRPC (ttrpc only).
    run env CGO_ENABLED=0 go build -trimpath -tags "urfave_cli_no_docs no_btrfs no_grpc" -ldflags "$ld" \
        -o "$out/containerd-shim-runc-v2" "$p/cmd/containerd-shim-runc-v2" || return
}

build_runc() {
    local out=$1
    # cgo for seccomp (Debian's libseccomp-dev via pkg-config). Upstream's
    # default tags also name libpathrs, a Rust library Debian does not have;
    # without it runc uses its Go fallback.
    run env CGO_ENABLED=1 go build -trimpath -buildmode=pie -tags "seccomp urfave_cli_no_docs" \
        -ldflags "-s -w" -o "$out/runc" github.com/opencontainers/runc || return
}

build_controller_runtime() {
    local out=$1
    run env CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/podset-controller" . || return
    run env CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/leader-elect" ./leader-elect || return
}

# "binary|arguments|text its output must contain" for every binary.
expected_versions() {
    local k=$KUBERNETES_VERSION e=${ETCD_VERSION#v} t=${CRI_TOOLS_VERSION#v}
    cat <<EOF
kube-apiserver|--version|Kubernetes $k
kubelet|--version|Kubernetes $k
kubectl|version --client|Client Version: $k
kube-scheduler|--version|Kubernetes $k
kube-controller-manager|--version|Kubernetes $k
etcd|--version|etcd Version: $e
etcdctl|version|etcdctl version: $e
crictl|--version|crictl version $t
critest|--version|critest version: $t
containerd|--version|$CONTAINERD_VERSION
ctr|--version|$CONTAINERD_VERSION
containerd-shim-runc-v2|-v|$CONTAINERD_VERSION
runc|--version|runc version ${RUNC_VERSION#v}
runc|--version|libseccomp: 
podset-controller|--version|controller-runtime $CONTROLLER_RUNTIME_VERSION
leader-elect|--version|client-go $KUBERNETES_STAGING_VERSION
EOF
}

# Runs each of component $1's binaries in directory $2 for its version; on a
# mismatch prints what was seen and fails.
verify_versions() {
    local c=$1 dir=$2 b args want ok=0
    local -A said=()
    while IFS='|' read -r b args want; do
        [[ " ${binaries[$c]} " == *" $b "* ]] || continue
        if [[ -z ${said["$b $args"]+set} ]]; then
            # shellcheck disable=SC2086 # args are words
            said["$b $args"]=$(KUBECONFIG=/dev/null timeout 60 "$dir/$b" $args 2>&1) || true
            echo "+ $b $args: ${said["$b $args"]}"
        fi
        if [[ ${said["$b $args"]} != *"$want"* ]]; then
            echo "$b $args does not print '$want'"
            echo "$b $args (which must print '$want')" >"$cmd_file.last"
            ok=1
        fi
    done < <(expected_versions)
    return $ok
}

# --- build --------------------------------------------------------------------

# The cache key of component $1: what its binaries are a function of.
cache_key() {
    local c=$1 fn=build_${1//-/_} f
    {
        echo "$c ${version[$c]}"
        go env GOVERSION GOOS GOARCH
        declare -f "$fn"
        cd "$peers_dir/$c"
        cat go.mod go.sum
        # Every .go file, in subdirectories too, in a fixed order (for the
        # components with top-level files only this is what ./*.go gave).
        find . -name '*.go' -type f -print0 | LC_ALL=C sort -z | xargs -0 -r cat
    } | sha256sum | cut -c1-12
}

# Whether directory $2 holds every binary of component $1.
has_binaries() {
    local b
    for b in ${binaries[$1]}; do [[ -x $2/$b ]] || return 1; done
}

# Builds component $1 into the cache unless it is there, and sets built_dir
# to its cache directory; on failure prints the one line that says what
# failed and where the log is, and leaves built_dir empty.
build_component() {
    local c=$1 v=${version[$1]} key dir tmp log rc lock_fd start cmd why
    built_dir=""
    key=$(cache_key "$c")
    dir=$cache/$c-$v-$key
    log=$cache/logs/$c-$v.log
    if [[ ! -d $dir ]]; then
        mkdir -p "$cache/logs" "$cache/locks"
        # Two runs at once (two clones, a session and CI): the second waits.
        exec {lock_fd}>"$cache/locks/$c-$v-$key"
        flock "$lock_fd"
    fi
    if [[ -d $dir ]] && ! has_binaries "$c" "$dir"; then
        # Built before a binary was added to the component's list: the
        # key is the recipe's, not the list's.
        [[ -n ${lock_fd:-} ]] || { exec {lock_fd}>"$cache/locks/$c-$v-$key"; flock "$lock_fd"; }
        if ! has_binaries "$c" "$dir"; then
            echo "peers: $dir lacks some of ${binaries[$c]}: rebuilding" >&2
            rm -rf "$dir"
        fi
    fi
    if [[ -d $dir ]]; then
        [[ -z ${lock_fd:-} ]] || exec {lock_fd}>&-
        built_dir=$dir
        echo "peers: $c $v cached in $dir" >&2
        return
    fi
    # What a run killed before the rename left behind (we hold the lock).
    rm -rf "$cache/.tmp-$c-$v-$key-"*
    tmp=$cache/.tmp-$c-$v-$key-$$
    mkdir -p "$tmp"
    echo "peers: building $c $v (key $key; log $log)" >&2
    start=$(date +%s)
    set +e
    (
        cmd_file=$tmp.cmds
        echo "# $c $v, key $key, $(go env GOVERSION), started $(date -u +%FT%TZ)"
        # Bash's `time` counts the CPU of every child (the go command, the
        # compiler, the linker): user + sys is the build's CPU time.
        TIMEFORMAT="wall %R s, user %U s, sys %S s"
        { time (cd "$peers_dir/$c" && "build_${c//-/_}" "$tmp"); } 2>&1
        rc=$?
        ((rc == 0)) || exit $rc
        verify_versions "$c" "$tmp"
    ) >"$log" 2>&1
    rc=$?
    set -e
    if ((rc != 0)); then
        exec {lock_fd}>&-
        cmd=$(cat "$tmp.cmds.last" 2>/dev/null || echo "build_${c//-/_}")
        # The log's last word on it (go prints the cause last).
        why=$(grep -Ev '^(\+ |wall |# |$)' "$log" | tail -n 1 | cut -c1-200) || true
        rm -rf "$tmp" "$tmp.cmds" "$tmp.cmds.last"
        echo "peers: FAILED $c $v: \`$cmd\` failed (exit $rc${why:+: $why}); full log: $log" >&2
        return
    fi
    {
        echo "component: $c"
        echo "version: $v"
        echo "key: $key"
        echo "go: $(go env GOVERSION) $(go env GOOS)/$(go env GOARCH)"
        echo "built: $(date -u +%FT%TZ), $(grep -E '^wall ' "$log" | tail -n 1), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
        echo "commands (in tools/peers/$c, output directory shown as OUT):"
        sed "s|$tmp|OUT|g; s|^|  |" "$tmp.cmds"
    } >"$tmp/BUILD-INFO"
    rm -f "$tmp.cmds" "$tmp.cmds.last"
    mv "$tmp" "$dir"
    exec {lock_fd}>&-
    built_dir=$dir
    echo "peers: built $c $v in $(($(date +%s) - start)) s ($(grep -E '^wall ' "$log" | tail -n 1))" >&2
}

skipped() {
    [[ " ${skip_list//,/ } " == *" $1 "* ]]
}

build_all() {
    local c s failed=0 b
    for s in ${skip_list//,/ }; do
        [[ " ${components[*]} " == *" $s "* ]] ||
            die "PETREL_PEERS_SKIP names '$s', which is no component (${components[*]})"
    done
    check_pins || die "the go.mod files under $peers_dir disagree with versions.env (see above)"
    command -v go >/dev/null || die "no go command (the machine kind installs Go at /usr/local/go)"
    mkdir -p "$cache" 2>/dev/null || true
    [[ -w $cache ]] ||
        die "cannot write the cache $cache (set PETREL_PEERS_CACHE to a writable directory)"
    mkdir -p "$bin_dir"
    for c in "${components[@]}"; do
        if skipped "$c"; then
            for b in ${binaries[$c]}; do rm -f "$bin_dir/$b"; done
            echo "peers: $c left out (PETREL_PEERS_SKIP)" >&2
            continue
        fi
        build_component "$c"
        if [[ -n $built_dir ]]; then
            for b in ${binaries[$c]}; do ln -sfn "$built_dir/$b" "$bin_dir/$b"; done
        else
            for b in ${binaries[$c]}; do rm -f "$bin_dir/$b"; done
            failed=1
        fi
    done
    cp "$peers_dir/versions.env" "$root/build/peers/versions.env"
    ((failed == 0)) || die "some peers failed to build (lines above); PETREL_PEERS_SKIP=<component,...> leaves a component out"
    echo "peers: binaries linked in $bin_dir" >&2
}

# --- path: the binary a test would use --------------------------------------

component_of() {
    local c
    for c in "${components[@]}"; do
        [[ " ${binaries[$c]} " == *" $1 "* ]] && { echo "$c"; return; }
    done
    return 1
}

peer_path() {
    local name=$1 c var path
    c=$(component_of "$name") || die "'$name' is no peer binary"
    var=PETREL_PEER_${name^^}
    var=${var//-/_}
    if [[ -n ${!var:-} ]]; then
        path=${!var}
    else
        path=${PETREL_PEERS_BIN:-$bin_dir}/$name
    fi
    if [[ -x $path ]]; then
        echo "$path"
    elif skipped "$c"; then
        die "$name: component $c is left out by PETREL_PEERS_SKIP"
    else
        die "$name: no executable at $path (run make peers, or set $var or PETREL_PEERS_BIN)"
    fi
}

# --- smoke: prove the binaries run --------------------------------------------

# A TCP port on 127.0.0.1 nobody listens on now.
free_port() {
    local p
    for _ in $(seq 50); do
        p=$((20000 + RANDOM % 20000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "$p"
            return
        fi
    done
    die "no free port found on 127.0.0.1"
}

# Waits up to $2 s for `curl $1` to print text containing $3.
wait_for() {
    local url=$1 want=$3 out="" deadline=$((SECONDS + $2))
    while ((SECONDS < deadline)); do
        out=$(curl -fsk --max-time 2 "$url" 2>/dev/null) || true
        if [[ $out == *"$want"* ]]; then
            echo "$url: $out"
            return
        fi
        sleep 0.25
    done
    return 1
}

smoke() {
    local tmp cport pport aport b
    tmp=$(mktemp -d /tmp/petrel-peers-smoke.XXXXXX)
    smoke_tmp=$tmp
    trap 'smoke_cleanup $?' EXIT
    local seen=" " args want path c
    while IFS='|' read -r b args want; do
        [[ $seen != *" $b "* ]] || continue
        seen+="$b "
        c=$(component_of "$b")
        if skipped "$c"; then
            echo "smoke: $b left out (PETREL_PEERS_SKIP)"
            continue
        fi
        path=$(peer_path "$b")
        # shellcheck disable=SC2086 # args are words
        echo "smoke: $b $args: $(KUBECONFIG=/dev/null timeout 60 "$path" $args 2>&1 | tr '\n' ' ')"
    done < <(expected_versions)
    if ! skipped cri-tools; then
        "$(peer_path critest)" --help >"$tmp/critest-help" 2>&1 || true
        grep -q -- '-runtime-endpoint' "$tmp/critest-help" ||
            die "smoke: critest --help does not list -runtime-endpoint; output: $tmp/critest-help"
        echo "smoke: critest --help lists -runtime-endpoint"
    fi
    if ! skipped runc; then
        "$(peer_path runc)" --version | grep -q '^libseccomp: ' || die "smoke: runc was built without seccomp"
    fi
    if skipped etcd || skipped kubernetes; then
        echo "smoke: etcd and kube-apiserver not started (PETREL_PEERS_SKIP)"
        return
    fi

    cport=$(free_port)
    pport=$(free_port)
    aport=$(free_port)
    "$(peer_path etcd)" --name smoke --data-dir "$tmp/etcd" \
        --listen-client-urls "http://127.0.0.1:$cport" --advertise-client-urls "http://127.0.0.1:$cport" \
        --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
        --initial-cluster "smoke=http://127.0.0.1:$pport" >"$tmp/etcd.log" 2>&1 &
    echo $! >>"$tmp/pids"
    wait_for "http://127.0.0.1:$cport/health" 60 '"health":"true"' ||
        die "smoke: etcd did not answer /health on 127.0.0.1:$cport within 60 s; log: $tmp/etcd.log"
    "$(peer_path etcdctl)" --endpoints "127.0.0.1:$cport" endpoint health

    openssl genrsa -out "$tmp/sa.key" 2048 2>/dev/null
    openssl rsa -in "$tmp/sa.key" -pubout -out "$tmp/sa.pub" 2>/dev/null
    "$(peer_path kube-apiserver)" --etcd-servers "http://127.0.0.1:$cport" \
        --bind-address 127.0.0.1 --secure-port "$aport" --cert-dir "$tmp/certs" \
        --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$tmp/sa.pub" \
        --service-account-signing-key-file "$tmp/sa.key" --service-cluster-ip-range 10.0.0.0/24 \
        --authorization-mode RBAC >"$tmp/apiserver.log" 2>&1 &
    echo $! >>"$tmp/pids"
    wait_for "https://127.0.0.1:$aport/readyz" 120 ok ||
        die "smoke: kube-apiserver did not answer /readyz on 127.0.0.1:$aport within 120 s; log: $tmp/apiserver.log"
    curl -fsk "https://127.0.0.1:$aport/version" | grep -q "\"gitVersion\": \"$KUBERNETES_VERSION\"" ||
        die "smoke: kube-apiserver's /version does not say $KUBERNETES_VERSION"
    echo "smoke: kube-apiserver $KUBERNETES_VERSION ready on 127.0.0.1:$aport over etcd on 127.0.0.1:$cport"
    echo "smoke: ok"
}

# Stops what smoke started, by PID and in reverse order (kube-apiserver's
# graceful shutdown waits for etcd), and removes its directory, or after a
# failure (exit status $1) keeps its logs.
smoke_cleanup() {
    local rc=$1 tmp=$smoke_tmp pid pids=()
    [[ -f $tmp/pids ]] && mapfile -t pids < <(tac "$tmp/pids")
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || continue
        for _ in $(seq 80); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.25
        done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$tmp/etcd" "$tmp/certs"
    if ((rc == 0)); then
        rm -rf "$tmp"
    else
        echo "smoke: logs kept in $tmp" >&2
    fi
}

case ${1:-build} in
build) build_all ;;
check) check_pins && echo "peers: go.mod files agree with versions.env" ;;
pin) pin ;;
path) peer_path "${2:?usage: scripts/peers.sh path NAME}" ;;
smoke) smoke ;;
*) die "unknown command '$1' (build, check, pin, path NAME, smoke)" ;;
esac
