#!/bin/sh
# Runs a private libvirtd (with its own virtlogd and virtlockd) as pid 1 of fresh mount, network and pid
# namespaces made by `unshare -m -n -p -f --mount-proc` (test/helpers/libvirt.ts). Root's libvirtd keeps its state
# in global places (/etc/libvirt, /run/libvirt, /var/lib/libvirt, /var/log/libvirt, /var/cache/libvirt); each
# is covered here by a folder of the private directory $1, so no other libvirtd on this machine is seen or
# touched. Bridges and firewall rules of test networks live in the private network namespace. This shell is pid
# 1 of the namespace: it reaps the orphans libvirtd leaves (libvirt waits for its QEMU probes to disappear, and a
# zombie never does), passes SIGTERM on to libvirtd, and when it ends the kernel ends every process of the
# namespace: virtlogd, virtlockd, dnsmasq and all guests. Only the client sockets ($1/sock) are reachable from
# outside.
set -eu
d="$1"
mount -t tmpfs ferry-run /run
mkdir -p /run/libvirt /run/lock
mount --bind "$d/etc" /etc/libvirt
mount --bind "$d/lib" /var/lib/libvirt
mount --bind "$d/log" /var/log/libvirt
mount --bind "$d/cache" /var/cache/libvirt
ip link set lo up
virtlogd -d -f "$d/etc/virtlogd.conf"
virtlockd -d -f "$d/etc/virtlockd.conf"
libvirtd -f "$d/etc/libvirtd.conf" &
pid=$!
trap 'kill -TERM $pid' TERM INT
# `wait` returns on every reaped child and on a trapped signal; loop until libvirtd itself is gone.
while kill -0 "$pid" 2>/dev/null; do wait || true; done
