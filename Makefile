# Petrel: `make demo` shows a node at work, `make test` runs every test.
# Both install what they need from Debian packages (run as root).
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c

CARGO ?= cargo
# One-off builds (CI) gain nothing from incremental caches but their disk use.
export CARGO_INCREMENTAL ?= 0
IMAGES := build/images
DEB_PACKAGES := runc busybox-static protobuf-compiler iproute2 util-linux procps curl \
	docker-registry skopeo apache2-utils openssl umoci containernetworking-plugins iptables \
	gcc libc6-dev binutils python3 pkg-config libseccomp-dev python3-venv \
	qemu-system-x86 kmod xz-utils systemd dbus
# critest's results against Petrel's runtime are held against this list.
CONFORMANCE_EXPECTED := crates/testkit/conformance/petrel.expected
# Where the tests find the peers (real Kubernetes components, `make peers`);
# PETREL_PEER_<NAME>=path points a test at one other binary.
PETREL_PEERS_BIN ?= $(CURDIR)/build/peers/bin
export PETREL_PEERS_BIN
# A grpc C-core client from PyPI for the test that any gRPC client is answered
# (grpcio sends the socket's path as :authority): pinned, in a venv of the clone.
PYENV := build/pyenv
GRPCIO_VERSION := 1.85.1

.PHONY: all deps build release shim-release image test unit lint fmt doc demo bench clean ci containerd \
	criu peers conformance-images conformance pyenv vm

all: build

## deps: install the Debian packages Petrel needs (idempotent)
deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

## build: debug build of every binary (petrel, petrel-shim)
build: deps
	$(CARGO) build --workspace --bins

## release: optimised build (what users run; the benchmarks measure it)
release: deps
	$(CARGO) build --release --workspace --bins
	$(MAKE) shim-release

# Where cargo puts release binaries ($CARGO_TARGET_DIR when set).
RELEASE_DIR = $(or $(CARGO_TARGET_DIR),target)/release

## shim-release: the shipped shim, target/release/petrel-shim, linked
## statically: no shared libraries mapped, so one per container stays within
## its 1 MB of RSS (docs/PERFORMANCE.md, P2). Its only dependency is libc, so
## this is cheap; `make test` checks the promise on it (e2e_promises).
shim-release: deps
	$(CARGO) rustc --release -p petrel-shim --bin petrel-shim -- \
	  -C target-feature=+crt-static -C relocation-model=static
	@if ldd $(RELEASE_DIR)/petrel-shim >/dev/null 2>&1; then \
	  echo "$(RELEASE_DIR)/petrel-shim is not statically linked" >&2; exit 1; fi

## image: the busybox test image archives, built from Debian's busybox-static
image: deps
	scripts/build-test-image.sh $(IMAGES)

## containerd: containerd 1.7 (trixie) and 1.6 (bookworm) and CNI plugins
## unpacked under build/ for the tests against them (nothing is installed)
containerd: deps
	scripts/containerd.sh build

## criu: CRIU 4.1 from Debian trixie unpacked under build/criu with the
## trixie libraries and loader it needs (its glibc is newer than bookworm's),
## run through build/criu/criu; for CheckpointContainer and restores in the
## tests (nothing is installed; the .debs are cached in build/debs/trixie)
criu: deps
	scripts/criu.sh build

## vm: the test VM's kernel (Debian bookworm's, unpacked, not installed) and
## initramfs, cached in /var/cache/petrel/vm and linked into build/vm: a pure
## cgroup v2 guest under QEMU for the tests of the cgroup v2 code paths
## (crates/testkit/src/vm.rs; a second run does nothing)
vm: deps
	scripts/vm.sh build

## peers: kubelet, kube-apiserver, kubectl, etcd, critest, containerd 2, runc,
## podset-controller (controller-runtime) and leader-elect (client-go)
## built from Go modules at the versions in tools/peers/versions.env, cached
## in /var/cache/petrel/peers and linked into build/peers/bin
## (PETREL_PEERS_SKIP=containerd,runc leaves components out)
peers: deps
	scripts/peers.sh

## conformance-images: substitutes for every image critest pulls, built from
## Debian packages into a registry storage cached by the script's hash under
## /var/cache/petrel/conformance (a second run does nothing)
conformance-images: deps
	scripts/conformance-images.sh >/dev/null

## conformance: critest against Petrel's runtime and containerd 2.x (both from
## `make peers`), side by side in build/conformance/summary.md; Petrel's
## results held against $(CONFORMANCE_EXPECTED)
conformance: build peers conformance-images
	$(CARGO) run -q -p petrel-testkit --bin petrel-conformance -- \
	  --petrel target/debug/petrel --out build/conformance --expected $(CONFORMANCE_EXPECTED)

## pyenv: a Python venv with grpcio $(GRPCIO_VERSION) from PyPI (build/pyenv)
pyenv: $(PYENV)/.grpcio-$(GRPCIO_VERSION)

$(PYENV)/.grpcio-$(GRPCIO_VERSION): | deps
	rm -rf $(PYENV)
	python3 -m venv $(PYENV)
	$(PYENV)/bin/pip install --quiet --disable-pip-version-check grpcio==$(GRPCIO_VERSION)
	touch $@

## lint: the vendored CRI proto, formatting and clippy, warnings are errors
lint: deps
	scripts/cri-proto.sh check
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS=-Dwarnings $(CARGO) doc --workspace --no-deps

fmt:
	$(CARGO) fmt --all

# The cgroup v2 VM's tests (ignored by a plain cargo test) and their log.
# Their executable is found in the workspace's build (the same features as
# the run of the others: `-p petrel-e2e` alone would build a second set).
VM_TEST_LOG := build/e2e_cgroup_v2.log

## test: install, build, lint, then every unit, integration and end-to-end
## test; the cgroup v2 VM's (e2e_cgroup_v2: minutes of software emulation
## on one core) run beside the others, their log in $(VM_TEST_LOG)
test: deps build shim-release image containerd criu peers conformance-images pyenv vm lint
	@export PETREL_PYTHON=$(CURDIR)/$(PYENV)/bin/python PETREL_REQUIRE_CONTAINERD=1 \
	  PETREL_TEST_IMAGES=$(CURDIR)/$(IMAGES); \
	vm_test=$$($(CARGO) test --workspace --no-run --message-format=json | \
	  python3 -c 'import json, sys; print(*[m["executable"] for m in map(json.loads, sys.stdin) if m.get("executable") and m["target"]["name"] == "e2e_cgroup_v2"])'); \
	[ -x "$$vm_test" ] || { echo "no e2e_cgroup_v2 executable ($$vm_test)" >&2; exit 1; }; \
	mkdir -p build; \
	( cd tests/e2e && exec "$$vm_test" --ignored --test-threads=1 --nocapture ) >$(VM_TEST_LOG) 2>&1 & vm=$$!; \
	rc=0; \
	if $(CARGO) nextest --version >/dev/null 2>&1; then \
	  $(CARGO) nextest run --workspace --no-fail-fast || rc=$$?; \
	else \
	  $(CARGO) test --workspace --no-fail-fast || rc=$$?; \
	fi; \
	vmrc=0; wait $$vm || vmrc=$$?; \
	echo "--- e2e_cgroup_v2 (the cgroup v2 VM, run beside the others): exit $$vmrc ---"; \
	if [ $$vmrc -eq 0 ]; then grep -E '^vm:|test result' $(VM_TEST_LOG); else cat $(VM_TEST_LOG); fi; \
	[ $$rc -eq 0 ] && [ $$vmrc -eq 0 ]
	$(CARGO) test --workspace --doc

unit: deps
	$(CARGO) test --workspace --lib

doc: deps
	RUSTDOCFLAGS=-Dwarnings $(CARGO) doc --workspace --no-deps

## demo: a runtime in a temporary root running a sample pod, visibly
demo: build image
	scripts/demo.sh

## bench: measure and write docs/PERFORMANCE.md
bench: release image peers conformance-images vm
	scripts/bench.sh

ci: test

clean:
	$(CARGO) clean
	rm -rf build
