#!/usr/bin/env bash
# The CRI api.proto Petrel's bindings are generated from (crates/cri/build.rs)
# is a vendored third-party file: third_party/cri-api/<version>/api.proto, the
# file of Go module k8s.io/cri-api at <version>, unchanged, with the module's
# LICENSE and a README naming the module, version and go.sum hash.
#
# Usage: scripts/cri-proto.sh check    the vendored files equal the module's,
#                                      and the README's hash is the module's
#                                      (`make lint`; needs the Go module proxy
#                                      or Go's module cache)
#        scripts/cri-proto.sh vendor   (re)write the vendored files from the
#                                      module (after changing VERSION below,
#                                      and crates/cri/build.rs's path)
set -euo pipefail

MODULE=k8s.io/cri-api
VERSION=v0.37.2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=$ROOT/third_party/cri-api/$VERSION
PROTO=pkg/apis/runtime/v1/api.proto

die() { echo "cri-proto: $*" >&2; exit 1; }

# The machine's Go: PATH first, then where the machine kind installs it.
if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then
    PATH=/usr/local/go/bin:$PATH
fi
command -v go >/dev/null || die "no go command (the machine kind installs Go at /usr/local/go)"

# Downloads (or finds in the module cache) the module; Go checks the zip
# against the checksum database. Prints "<dir> <sum>".
module() {
    local json dir sum
    # Outside any Go module, so no go.mod of ours is consulted or changed.
    json=$(cd / && GOFLAGS=-mod=mod go mod download -json "$MODULE@$VERSION") ||
        die "go mod download $MODULE@$VERSION failed"
    dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' <<<"$json")
    sum=$(sed -n 's/^[[:space:]]*"Sum": "\(.*\)",$/\1/p' <<<"$json")
    [[ -n $dir && -n $sum ]] || die "no Dir or Sum in go mod download's answer: $json"
    echo "$dir $sum"
}

case "${1:-check}" in
check)
    read -r dir sum < <(module)
    [[ -d $DEST ]] || die "$DEST missing: run scripts/cri-proto.sh vendor"
    cmp -s "$dir/$PROTO" "$DEST/api.proto" ||
        die "$DEST/api.proto differs from $MODULE@$VERSION's $PROTO (vendored files are never edited)"
    cmp -s "$dir/LICENSE" "$DEST/LICENSE" ||
        die "$DEST/LICENSE differs from $MODULE@$VERSION's LICENSE"
    grep -qF "$MODULE $VERSION $sum" "$DEST/README.md" ||
        die "$DEST/README.md does not name '$MODULE $VERSION $sum'"
    grep -qF "third_party/cri-api/$VERSION/api.proto" "$ROOT/crates/cri/build.rs" ||
        die "crates/cri/build.rs does not build third_party/cri-api/$VERSION/api.proto"
    echo "cri-proto: $DEST matches $MODULE@$VERSION ($sum)"
    ;;
vendor)
    read -r dir sum < <(module)
    mkdir -p "$DEST"
    install -m 0644 "$dir/$PROTO" "$DEST/api.proto"
    install -m 0644 "$dir/LICENSE" "$DEST/LICENSE"
    cat >"$DEST/README.md" <<README
# CRI v1 \`api.proto\` (third-party, vendored unchanged)

- Go module: \`$MODULE\`
- Version: \`$VERSION\`
- Module hash (go.sum): \`$MODULE $VERSION $sum\`
- Files: \`api.proto\` is the module's \`$PROTO\`; \`LICENSE\` is the module's
  licence (Apache-2.0).

\`crates/cri/build.rs\` generates Petrel's CRI bindings (\`petrel_cri::api\`) from this
file with tonic-build. Do not edit it: \`scripts/cri-proto.sh check\` (run by \`make lint\`)
fails when it differs from the module's file. To move to another version, change
\`VERSION\` in \`scripts/cri-proto.sh\`, run \`scripts/cri-proto.sh vendor\`, then point
\`crates/cri/build.rs\` at the new directory.
README
    echo "cri-proto: vendored $MODULE@$VERSION ($sum) into $DEST"
    ;;
*)
    die "usage: $0 [check|vendor]"
    ;;
esac
