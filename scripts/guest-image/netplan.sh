#!/usr/bin/env bash
# The netplan variant of the Debian guest fixture, as a layer on the plain variant (same root, boot loader and
# MODULES=dep initramfs): the static address moves from ifupdown to netplan with the systemd-networkd renderer
# (/etc/netplan/01-vmware.yaml naming ens192), and a second disk holds a data file system mounted by its device
# name, `/dev/sdb1 /data` in fstab without `nofail`, so the guest does not reach its marker unless that disk is
# found. The data disk sits on VMware's paravirtual SCSI controller (pvscsi), as data disks often do: its driver is
# not in the MODULES=dep initramfs, so it loads after the root disk is named and is always sdb (two disks on one
# AHCI controller are probed at once, and the first build saw the data disk become sda). netplan.io is installed by
# the guest's own apt in a chroot on this host (layer-lib.sh's native_install); the guest generates its networkd
# configuration on a first boot from AHCI, the data disk on pvscsi, as on VMware.
# Usage: netplan.sh <plain disk.vmdk> <rootfs.tar it was built from> <output dir>. Writes <output dir>/disk.vmdk
# (the system disk), data.vmdk (the data disk), firstboot.log.
set -euo pipefail
plain=$1 rootfs=$2 out=$3
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=layer-lib.sh
. "$here/layer-lib.sh"
mkdir -p "$out"
raw="$out/disk.raw" dataraw="$out/data.raw"
export LIBGUESTFS_BACKEND_SETTINGS=${LIBGUESTFS_BACKEND_SETTINGS:-force_tcg}
step() { echo "netplan.sh $(date -u +%T) $*" >&2; }

cfg=$(mktemp -d "$out/cfg.XXXXXX")
trap 'rm -rf "$cfg"' EXIT

step "fetching netplan.io and what the guest lacks for it (apt-get --download-only against the guest's dpkg status)"
fetch_for_guest "$rootfs" "$cfg/ferry-debs" netplan.io
step "installing them into the guest's root at this host's speed (chroot)"
mkdir "$cfg/native"
native_install "$rootfs" "$cfg/ferry-debs" "$cfg/native"
mapfile -t lay < <(lay_native_install "$cfg/native")

cat > "$cfg/fstab" <<'EOF'
# /etc/fstab: static file system information (device names, as the VMware template had).
/dev/sda1  /      ext4  errors=remount-ro  0  1
/dev/sdb1  /data  ext4  defaults           0  2
EOF
# ifupdown keeps only the loopback: the NIC is netplan's.
cat > "$cfg/interfaces" <<'EOF'
source /etc/network/interfaces.d/*

auto lo
iface lo inet loopback
EOF
cat > "$cfg/netplan.yaml" <<'EOF'
# The VMware NIC (vmxnet3 in PCIe slot 192), static, rendered by systemd-networkd.
network:
  version: 2
  renderer: networkd
  ethernets:
    ens192:
      addresses: [10.0.2.15/24]
      routes:
        - to: default
          via: 10.0.2.2
EOF
write_firstboot "$cfg/ferry-firstboot" "netplan generate && systemctl enable systemd-networkd.service && netplan get ethernets"

step "copying the plain variant, adding the data disk, the packages and netplan's configuration (libguestfs appliance)"
qemu-img convert -f vmdk -O raw "$plain" "$raw"
qemu-img create -q -f raw "$dataraw" 1G
guestfish -- add "$raw" format:raw : add "$dataraw" format:raw : run \
  : part-init /dev/sdb mbr : part-add /dev/sdb p 2048 -1 : mkfs ext4 /dev/sdb1 label:data \
  : mount /dev/sda1 / : mkdir /data : mount /dev/sdb1 /data : write /data/ferry-data "the data disk" : umount /data "${lay[@]}" \
  : upload "$cfg/fstab" /etc/fstab : upload "$cfg/interfaces" /etc/network/interfaces \
  : mkdir-p /etc/netplan : upload "$cfg/netplan.yaml" /etc/netplan/01-vmware.yaml : chmod 0600 /etc/netplan/01-vmware.yaml \
  : write /etc/hostname "ferry-guest-netplan" : command "sed -i -e s/ferry-guest-plain/ferry-guest-netplan/ /etc/hosts" \
  : upload "$here/guest-ready-mounts.sh" /usr/local/sbin/ferry-guest-ready : chmod 0755 /usr/local/sbin/ferry-guest-ready \
  : upload "$cfg/ferry-firstboot" /usr/local/sbin/ferry-firstboot : chmod 0755 /usr/local/sbin/ferry-firstboot \
  : touch /etc/ferry-firstboot : command "systemctl enable ferry-firstboot.service" \
  : download /vmlinuz "$cfg/vmlinuz" : download /initrd.img "$cfg/initrd.img" : sync
# /initrd.img is the plain disk's own (MODULES=dep: ahci, no pvscsi), handed to qemu as the boot loader would.

step "first boot on AHCI with the data disk on pvscsi, its own initramfs (netplan generate, systemd-networkd enabled; then it powers off)"
accel=tcg; [ "${FERRY_GUESTFS_KVM:-}" = 1 ] && accel=kvm
timeout --kill-after=10 "${FERRY_FIRSTBOOT_TIMEOUT:-1800}" qemu-system-x86_64 \
  -machine "pc,accel=$accel" -m 1024 -smp 1 -nodefaults -display none -monitor none \
  -serial "file:$out/firstboot.log" -no-reboot \
  -kernel "$cfg/vmlinuz" -initrd "$cfg/initrd.img" -append "root=/dev/sda1 ro console=ttyS0,115200n8" \
  -device ahci,id=ahci0 -device pvscsi,id=scsi0 \
  -drive "file=$raw,format=raw,if=none,id=d0,cache=unsafe" -device ide-hd,drive=d0,bus=ahci0.0 \
  -drive "file=$dataraw,format=raw,if=none,id=d1,cache=unsafe" -device scsi-hd,drive=d1,bus=scsi0.0 \
  || { echo "netplan.sh: the first boot did not power off in time (exit $?); console: $out/firstboot.log" >&2; tail -n 40 "$out/firstboot.log" >&2; exit 1; }
grep -q FERRY-FIRSTBOOT-DONE "$out/firstboot.log" \
  || { echo "netplan.sh: the first boot did not generate netplan's configuration; console: $out/firstboot.log" >&2; tail -n 40 "$out/firstboot.log" >&2; exit 1; }

step "checking netplan, networkd and the data disk"
guestfish --ro --format=raw -a "$raw" -a "$dataraw" -- run : mount-ro /dev/sda1 / : mount-ro /dev/sdb1 /data \
  : is-file /usr/sbin/netplan followsymlinks:true : is-symlink /etc/systemd/system/multi-user.target.wants/systemd-networkd.service \
  : cat /data/ferry-data > "$cfg/check"
[ "$(cat "$cfg/check")" = "$(printf 'true\ntrue\nthe data disk')" ] || { echo "netplan.sh: want netplan, networkd enabled and the data file, got: $(cat "$cfg/check")" >&2; exit 1; }

step "shipping both disks as streamOptimized VMDKs"
qemu-img convert -f raw -O vmdk -o subformat=streamOptimized "$raw" "$out/disk.vmdk"
qemu-img convert -f raw -O vmdk -o subformat=streamOptimized "$dataraw" "$out/data.vmdk"
rm -f "$raw" "$dataraw"
step "done: $out/disk.vmdk, $out/data.vmdk"
