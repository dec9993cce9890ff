#!/bin/busybox sh
# v2vm guest, stage 1: PID 1 of the initramfs (busybox-static, a few kernel modules, this script, guest.sh).
# Loads the virtio/9p/overlay modules, mounts the host's root (9p, read-only) under a tmpfs overlay as the new
# root and hands over to guest.sh there. A failure is said on the console (the host prints its tail) and the
# VM powers off without a status, which the host reports.
bb=/bin/busybox
fail() {
    echo "v2vm init: $*" >/dev/console
    $bb sync
    $bb poweroff -f
}
$bb mkdir -p /proc /sys /dev /lower /rw /newroot
$bb mount -t proc proc /proc
$bb mount -t sysfs sysfs /sys
$bb mount -t devtmpfs devtmpfs /dev
# modules.order: the needed modules, dependencies first (resolved from modules.dep on the host)
while read -r mod; do
    $bb insmod "/modules/$mod" || fail "insmod $mod failed"
done </modules.order
# cache=loose: the host's root does not change under the guest during a run; it makes imports from 9p fast
$bb mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose hostroot /lower \
    || fail "cannot mount the host's root (9p tag hostroot)"
$bb mount -t tmpfs -o mode=0755 tmpfs /rw || fail "cannot mount the tmpfs for writes"
$bb mkdir -p /rw/upper /rw/work
$bb mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot \
    || fail "cannot mount the overlay root (host root read-only + tmpfs)"
$bb mount -t tmpfs -o mode=0755 tmpfs /newroot/run || fail "cannot mount /run"
$bb mkdir -p /newroot/run/v2vm
$bb cp /bin/busybox /guest.sh /newroot/run/v2vm/ || fail "cannot copy stage 2"
for d in proc sys dev; do
    $bb mount --move "/$d" "/newroot/$d" || fail "cannot move /$d"
done
exec $bb switch_root /newroot /run/v2vm/busybox sh /run/v2vm/guest.sh
fail "switch_root failed"
