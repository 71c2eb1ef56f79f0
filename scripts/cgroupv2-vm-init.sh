#!/bin/busybox sh
# PID 1 of the cgroup v2 test VM that scripts/cgroupv2-vm boots (busybox sh).
#
# stage 1 (in the initramfs): load the virtio/9p/overlay modules, mount the host's root (9p tag
#   "root", read-only) under a tmpfs overlay, move proc, sys and dev onto it, switch_root into it
#   and run this file again as
# stage 2 (on that root, the host's userland): cgroup2 (unified only) at /sys/fs/cgroup, tmpfs
#   /tmp (and /run, from stage 1), the kernel's modules at /lib/modules/$(uname -r), the writable
#   9p share "out" at the host's path of it, loopback up; run OUT/command, write its exit status
#   to OUT/exit-status (and a marker line on the console), then power off.
#
# Parameters come from the kernel command line: tkvm.out=HOST_OUT_DIR tkvm.modules=HOST_MODULES_DIR.

STATUS_MARKER='cgroupv2-vm: exit status'
P9_OPTS='trans=virtio,version=9p2000.L,msize=512000'

say() { echo "cgroupv2-vm: $*"; }

param() {
  for word in $(cat /proc/cmdline); do
    case $word in "tkvm.$1="*) echo "${word#*=}" ;; esac
  done
}

# A guest that cannot set up never runs the command: report, and power off so the host sees it.
fail() {
  say "guest setup failed: $*"
  echo "$STATUS_MARKER 125"
  sync
  /bin/busybox reboot -f
  sleep 60
}

stage1() {
  PATH=/bin
  mount -t proc proc /proc && mount -t sysfs sysfs /sys && mount -t devtmpfs devtmpfs /dev \
    || fail "proc/sys/dev"
  for module in $(cat /modules.order); do
    insmod "/modules/$module" || fail "insmod $module"
  done
  mkdir -p /lower /rw /newroot
  # cache=loose: the host's root is read-only for the guest, so its pages can be cached.
  mount -t 9p -o "$P9_OPTS,ro,cache=loose" root /lower || fail "9p root"
  mount -t tmpfs -o mode=0755 rw /rw && mkdir /rw/upper /rw/work || fail "tmpfs upper"
  mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot \
    || fail "overlay root"
  mount -t tmpfs -o mode=0755,nosuid,nodev run /newroot/run || fail "tmpfs /run"
  mkdir -p /newroot/run/cgroupv2-vm && cp /init /newroot/run/cgroupv2-vm/init || fail "copy init"
  # Moved, not mounted again in stage 2: until the guest's /proc is mounted, /proc in the new
  # root is the host's (through 9p), and busybox runs its applets through /proc/self/exe.
  for fs in /dev /proc /sys; do
    mount --move "$fs" "/newroot$fs" || fail "move $fs"
  done
  exec switch_root /newroot /bin/busybox sh /run/cgroupv2-vm/init stage2
}

stage2() {
  export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  # The unified hierarchy only (cgroup_no_v1=all), mounted with the options systemd uses.
  mount -t cgroup2 -o nsdelegate,memory_recursiveprot cgroup2 /sys/fs/cgroup || fail "cgroup2"
  # What udev would add to devtmpfs: bash's process substitution needs /dev/fd.
  ln -sf /proc/self/fd /dev/fd && ln -sf /proc/self/fd/0 /dev/stdin \
    && ln -sf /proc/self/fd/1 /dev/stdout && ln -sf /proc/self/fd/2 /dev/stderr || fail "/dev/fd"
  mkdir -p /dev/pts /dev/shm
  mount -t devpts -o gid=5,mode=0620,ptmxmode=0666 devpts /dev/pts || fail "devpts"
  mount -t tmpfs -o mode=1777,nosuid,nodev shm /dev/shm || fail "/dev/shm"
  # containerd keeps its root (overlay snapshots) under /tmp in the tests: overlayfs refuses an
  # overlayfs upper layer, a tmpfs one works.
  mount -t tmpfs -o mode=1777 tmp /tmp || fail "tmpfs /tmp"
  kernel=$(uname -r)
  mkdir -p "/lib/modules/$kernel" && mount --bind "$(param modules)" "/lib/modules/$kernel" \
    || fail "modules"
  out=$(param out)
  mkdir -p "$out" && mount -t 9p -o "$P9_OPTS,cache=none" out "$out" || fail "9p out"
  hostname -F /etc/hostname 2>/dev/null || hostname cgroupv2-vm
  ip link set lo up || fail "loopback"
  say "booted in $(cut -d' ' -f1 /proc/uptime) s; cgroup2 controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
  # Through a pipe, as in CI: no terminal, so no colours or progress redraws on the console.
  set -o pipefail
  /bin/sh "$out/command" </dev/null 2>&1 | cat
  status=$?
  echo "$status" >"$out/exit-status"
  sync
  echo "$STATUS_MARKER $status"
  umount "$out"
  /bin/busybox reboot -f
}

case ${1:-stage1} in
  stage1) stage1 ;;
  stage2) stage2 ;;
esac
