#!/bin/sh
# PID 1 of every harness VM (tests/vm/lib.sh packs it as /init into the initramfs, next to a
# static busybox and the modules needed to boot). It runs busybox sh, not bash.
#
#   1. loads virtio-pci, virtio-net, 9p and overlay from the initramfs;
#   2. mounts the host's / (9p tag hostroot, read-only) under a tmpfs overlay at /newroot, so
#      everything the host has (binaries, tools, this checkout) is there, and writes stay in
#      the VM's memory;
#   3. mounts the VM's results directory (9p tag vmout, writable) at /vm/out and the directory
#      all VMs of a test share (tag vmshared) at /vm/shared; binds the extracted kernel's
#      modules (kernel parameter vm.modules: their path on the host) at /lib/modules/VERSION,
#      both here (the kernel's own module requests run /sbin/modprobe in this root) and in
#      /newroot;
#   4. runs /vm/out/run.sh (written by vm_start) chrooted into /newroot, its stdout and stderr
#      into /vm/out/stdout and /vm/out/stderr, then its exit status into /vm/out/status and
#      /vm/shared/NAME.status (peers wait for that), and powers off.
# A failure before the script runs is written to the console and the VM powers off without a
# status: the host reports that, with the console's tail.
PATH=/bin
export PATH

# die MESSAGE: the VM cannot run its script; says why on the console and powers off.
die() {
    echo "vm-init: FAILED: $*"
    [ -d /newroot/vm/out ] && echo "init: $*" >/newroot/vm/out/step
    poweroff -f
}

# cmdline_value KEY: the value of kernel parameter KEY=VALUE (empty if absent).
cmdline_value() {
    for arg in $(cat /proc/cmdline); do
        case $arg in "$1"=*) echo "${arg#*=}" ;; esac
    done
}

# mount_9p TAG DIR [OPTION]: a virtio 9p share of the host (large messages: fewer round trips).
mount_9p() {
    mkdir -p "$2" && mount -t 9p -o "trans=virtio,version=9p2000.L,msize=512000${3:+,$3}" "$1" "$2"
}

# root_overlay: /newroot is the host's / (read-only) under a writable tmpfs layer.
root_overlay() {
    mount_9p hostroot /lower ro || die "cannot mount the host's / (9p tag hostroot)"
    mount -t tmpfs -o mode=0755 tmpfs /rw || die "tmpfs /rw"
    mkdir -p /rw/upper /rw/work /newroot
    mount -t overlay overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work /newroot ||
        die "overlay of the host's / failed"
}

# api_mounts: what a system needs in /newroot (fresh proc, sys, dev, run).
api_mounts() {
    mount -t proc proc /newroot/proc &&
        mount -t sysfs sysfs /newroot/sys &&
        mount -t devtmpfs devtmpfs /newroot/dev &&
        mkdir -p /newroot/dev/pts /newroot/dev/shm &&
        mount -t devpts devpts /newroot/dev/pts &&
        mount -t tmpfs tmpfs /newroot/dev/shm &&
        mount -t tmpfs -o mode=0755 tmpfs /newroot/run || die "proc/sys/dev/run mounts failed"
    # /tmp stays the overlay's: a test's files in the host's /tmp (its $T) are visible there.
}

# vm_dirs NAME: the results and shared directories, modules, and a busybox for the modutils.
vm_dirs() {
    mount_9p vmout /newroot/vm/out || die "cannot mount the results directory (9p tag vmout)"
    mount_9p vmshared /newroot/vm/shared || die "cannot mount the shared directory (9p tag vmshared)"
    echo "init: mounting modules" >/newroot/vm/out/step
    mods=$(cmdline_value vm.modules)
    [ -d "/lower$mods" ] || die "no modules at $mods on the host (vm.modules)"
    mkdir -p "/lib/modules/$KVER" "/newroot/lib/modules/$KVER"
    mount -o bind "/lower$mods" "/lib/modules/$KVER" &&
        mount -o bind "/lower$mods" "/newroot/lib/modules/$KVER" || die "cannot bind the modules"
    # modprobe & co. in the VM are busybox's: its depmod wrote modules.dep on the host (kmod's
    # modprobe would need modules.dep.bin, and the host may not have kmod at all).
    mkdir -p /newroot/vm/bin
    cp /bin/busybox /newroot/vm/bin/busybox || die "cannot copy busybox"
    for a in modprobe insmod rmmod lsmod modinfo; do ln -sf busybox "/newroot/vm/bin/$a"; done
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
KVER=$(uname -r)
NAME=$(cmdline_value vm.name)
echo "vm-init: $NAME: kernel $KVER, loading the boot modules"
modprobe -a virtio_pci virtio_net 9pnet_virtio 9p overlay || die "boot modules failed to load"
root_overlay
api_mounts
vm_dirs
hostname "$NAME"
ip link set lo up
echo 1 >/proc/sys/kernel/panic_on_oops
echo "init: running the script" >/newroot/vm/out/step
echo "vm-init: $NAME: running its script"
chroot /newroot /bin/bash /vm/out/run.sh </dev/null >/newroot/vm/out/stdout 2>/newroot/vm/out/stderr
rc=$?
echo "$rc" >/newroot/vm/out/status.tmp && mv /newroot/vm/out/status.tmp /newroot/vm/out/status
echo "$rc" >"/newroot/vm/shared/$NAME.status"
echo "vm-init: $NAME: script exited $rc, powering off"
sync
poweroff -f
