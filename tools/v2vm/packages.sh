#!/usr/bin/env bash
# The Debian packages the v2 VM boots from (tools/v2vm/run.py): qemu-system-x86, linux-image-amd64 (a kernel in
# /boot and its modules) and busybox-static. Installs the missing ones with apt-get when it can (root and
# apt-get); otherwise says what is missing and exits 0: run.py then reports it (exit 125) and the suite skips,
# or fails under KOORDQOS_E2E_CGROUPV2=require.
set -euo pipefail

say() { echo "v2vm packages: $*" >&2; }

need=()
command -v qemu-system-x86_64 >/dev/null 2>&1 || need+=(qemu-system-x86)
compgen -G "/boot/vmlinuz-*" >/dev/null || need+=(linux-image-amd64)
static_busybox=""
for bb in /bin/busybox /usr/bin/busybox; do
    if [ -x "$bb" ] && ! ldd "$bb" >/dev/null 2>&1; then static_busybox="$bb"; break; fi
done
[ -n "$static_busybox" ] || need+=(busybox-static)

if [ "${#need[@]}" -eq 0 ]; then
    say "qemu, a kernel and a static busybox are there"
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    say "missing ${need[*]} (and no root apt-get to install them)"
    exit 0
fi
say "installing ${need[*]} from Debian"
apt-get update -qq >&2 || { say "apt-get update failed"; exit 0; }
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2 \
    || say "apt-get install ${need[*]} failed"
