# v2vm guest, stage 2: PID 1 in the new root (the host's root read-only + tmpfs overlay), run by busybox sh.
# Mounts what a node has (devpts, /dev/shm, cgroup2 with cpu cpuset io memory pids enabled, loopback up),
# runs the host's command (xfer/cmd, written by run.py) with its output on the second serial port, writes its
# exit status to xfer/rc and powers off.
bb=/run/v2vm/busybox
xfer=/run/v2vm/xfer
fail() {
    echo "v2vm guest: $*" >/dev/console
    $bb sync
    $bb poweroff -f
}
$bb mkdir -p /dev/pts /dev/shm $xfer
$bb mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts
$bb mount -t tmpfs -o mode=1777 tmpfs /dev/shm
# /tmp is left as the overlay has it (writable, in the VM's RAM): a tmpfs over it would hide a checkout or a
# virtual environment that lives under the host's /tmp (a clean clone there failed with "can't cd")
$bb mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup || fail "cannot mount cgroup2 at /sys/fs/cgroup"
echo "+cpu +cpuset +io +memory +pids" >/sys/fs/cgroup/cgroup.subtree_control \
    || fail "cannot enable the controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
$bb ip link set lo up || fail "cannot bring up the loopback"
$bb hostname v2vm
$bb mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 xfer $xfer || fail "cannot mount the xfer share"
$bb stty -F /dev/ttyS1 115200 raw -echo || fail "cannot set up /dev/ttyS1"
: >$xfer/started
$bb sh $xfer/cmd </dev/null >/dev/ttyS1 2>&1
echo $? >$xfer/rc.part && $bb mv $xfer/rc.part $xfer/rc
$bb sync
$bb poweroff -f
