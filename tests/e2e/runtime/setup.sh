#!/usr/bin/env bash
# Build the real container runtime for the e2e-runtime suites, cached by version:
#   runc (Debian package), containerd v2 + ctr + containerd-shim-runc-v2 and crictl (go install from the Go
#   module proxy), a static pause binary (gcc -static) and busybox-static, packed as local OCI images.
# Prints KEY=VALUE lines (paths) on stdout for the test fixtures; a failure exits non-zero with one line on
# stderr that says what is missing (the fixtures skip with that line as the reason).
# A second run with the same versions only checks the cache: a few seconds.
set -euo pipefail

CONTAINERD_VERSION="${KOORDQOS_E2E_CONTAINERD_VERSION:-v2.4.2}"
CRICTL_VERSION="${KOORDQOS_E2E_CRICTL_VERSION:-v1.37.0}"
CACHE="${KOORDQOS_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/koordqos-e2e}"
HERE="$(cd "$(dirname "$0")" && pwd)"
PYTHON="${PYTHON:-python3}"

die() { echo "e2e-runtime setup: $*" >&2; exit 1; }
log() { echo "e2e-runtime setup: $*" >&2; }

[ "$(id -u)" = 0 ] || die "needs root (runs containerd and writes real cgroups)"
command -v go >/dev/null 2>&1 || die "no Go toolchain on PATH (needed to build containerd and crictl)"

# -- Debian packages: runc, busybox-static -----------------------------------------------------------------
need_pkgs=()
command -v runc >/dev/null 2>&1 || need_pkgs+=(runc)
[ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1 || need_pkgs+=(busybox-static)
if [ "${#need_pkgs[@]}" -gt 0 ]; then
    command -v apt-get >/dev/null 2>&1 || die "missing ${need_pkgs[*]} and no apt-get to install them"
    log "installing ${need_pkgs[*]} from Debian"
    apt-get update -qq >&2 || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >&2 \
        || die "apt-get install ${need_pkgs[*]} failed"
fi
RUNC="$(command -v runc)"

# -- containerd, ctr, shim; crictl (go install, cached by version) ----------------------------------------
go_build() {  # go_build BIN_DIR PACKAGE@VERSION...
    local bin="$1"; shift
    mkdir -p "$bin"
    local tmp; tmp="$(mktemp -d "$bin/../.build.XXXXXX")"
    log "go install $* (first run downloads modules and compiles: minutes)"
    # static, no cgo: the cgo-only btrfs snapshotter is left out; overlayfs is all the e2e needs
    if ! GOBIN="$tmp" CGO_ENABLED=0 go install "$@" >&2; then
        rm -rf "$tmp"
        die "go install $* failed (Go module proxy: $(go env GOPROXY))"
    fi
    mv "$tmp"/* "$bin"/ && rmdir "$tmp"
}

CTRD_BIN="$CACHE/containerd-$CONTAINERD_VERSION/bin"
if ! [ -x "$CTRD_BIN/containerd" ] || ! [ -x "$CTRD_BIN/ctr" ] || ! [ -x "$CTRD_BIN/containerd-shim-runc-v2" ]; then
    mod=github.com/containerd/containerd/v2
    go_build "$CTRD_BIN" "$mod/cmd/containerd@$CONTAINERD_VERSION" "$mod/cmd/ctr@$CONTAINERD_VERSION" \
        "$mod/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION"
fi
CRICTL_BIN="$CACHE/crictl-$CRICTL_VERSION/bin"
if ! [ -x "$CRICTL_BIN/crictl" ]; then
    go_build "$CRICTL_BIN" "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
fi

# -- images: a static pause (a few lines of C) and busybox-static, as OCI archives -------------------------
command -v gcc >/dev/null 2>&1 || die "no gcc (builds the static pause binary)"
IMG="$CACHE/images"
mkdir -p "$IMG"
key="$(cat "$HERE/pause.c" "$HERE/ociimage.py" /bin/busybox | sha256sum | cut -c1-16)"
PAUSE_TAR="$IMG/pause-$key.tar"
WORKLOAD_TAR="$IMG/workload-$key.tar"
if ! [ -s "$PAUSE_TAR" ] || ! [ -s "$WORKLOAD_TAR" ]; then
    gcc -static -Os -o "$IMG/pause" "$HERE/pause.c" || die "gcc -static pause.c failed (need libc6-dev)"
    "$PYTHON" "$HERE/ociimage.py" "$PAUSE_TAR.part" localhost/koordqos-e2e/pause:1 /pause \
        --file "$IMG/pause:/pause" || die "packing the pause image failed"
    links=()
    for applet in sh sleep cat yes true; do links+=(--link "bin/$applet:busybox"); done
    "$PYTHON" "$HERE/ociimage.py" "$WORKLOAD_TAR.part" localhost/koordqos-e2e/busybox:1 "/bin/sh" \
        --file /bin/busybox:/bin/busybox "${links[@]}" || die "packing the workload image failed"
    mv "$PAUSE_TAR.part" "$PAUSE_TAR"
    mv "$WORKLOAD_TAR.part" "$WORKLOAD_TAR"
fi

cat <<EOF
CONTAINERD_VERSION=$CONTAINERD_VERSION
CRICTL_VERSION=$CRICTL_VERSION
CONTAINERD=$CTRD_BIN/containerd
CTR=$CTRD_BIN/ctr
SHIM_DIR=$CTRD_BIN
CRICTL=$CRICTL_BIN/crictl
RUNC=$RUNC
PAUSE_IMAGE=localhost/koordqos-e2e/pause:1
PAUSE_TAR=$PAUSE_TAR
WORKLOAD_IMAGE=localhost/koordqos-e2e/busybox:1
WORKLOAD_TAR=$WORKLOAD_TAR
EOF
