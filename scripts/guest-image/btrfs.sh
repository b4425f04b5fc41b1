#!/usr/bin/env bash
# The btrfs variant of the Debian guest fixture, as a layer on the plain variant (same root file system, ifupdown
# and GRUB defaults): one btrfs file system on /dev/sda1 with the subvolumes `@` (mounted as /) and `@home`
# (/home), both named by device in fstab with `subvol=`, as a Debian or SUSE installer lays btrfs out. The guest
# gets btrfs-progs from a chroot on this host (layer-lib.sh's native_install) and installs GRUB and its MODULES=dep
# initramfs itself on a first boot from AHCI (grub-mkconfig adds
# `rootflags=subvol=@` to the kernel line), as on VMware.
# Usage: btrfs.sh <plain disk.vmdk> <rootfs.tar it was built from> <output dir>. Writes <output dir>/disk.vmdk,
# firstboot.log.
set -euo pipefail
plain=$1 rootfs=$2 out=$3
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=layer-lib.sh
. "$here/layer-lib.sh"
mkdir -p "$out"
raw="$out/disk.raw"
export LIBGUESTFS_BACKEND_SETTINGS=${LIBGUESTFS_BACKEND_SETTINGS:-force_tcg}
step() { echo "btrfs.sh $(date -u +%T) $*" >&2; }

cfg=$(mktemp -d "$out/cfg.XXXXXX")
trap 'rm -rf "$cfg"' EXIT

step "fetching btrfs-progs and what the guest lacks for it (apt-get --download-only against the guest's dpkg status)"
fetch_for_guest "$rootfs" "$cfg/ferry-debs" btrfs-progs
step "installing them into the guest's root at this host's speed (chroot)"
mkdir "$cfg/native"
native_install "$rootfs" "$cfg/ferry-debs" "$cfg/native"
mapfile -t lay < <(lay_native_install "$cfg/native")

cat > "$cfg/fstab" <<'EOF'
# /etc/fstab: static file system information (device names, as the VMware template had).
/dev/sda1  /      btrfs  subvol=@      0  0
/dev/sda1  /home  btrfs  subvol=@home  0  0
EOF
write_firstboot "$cfg/ferry-firstboot" "grub-install --target=i386-pc /dev/sda && update-grub && update-initramfs -u -k all"

step "copying the plain variant into btrfs subvolumes @ and @home (libguestfs appliance)"
qemu-img create -q -f raw "$raw" 3G
guestfish -- add "$plain" readonly:true format:vmdk : add "$raw" format:raw : run \
  : mount-ro /dev/sda1 / : tar-out / "$cfg/root.tar" xattrs:true numericowner:true : umount / \
  : part-init /dev/sdb mbr : part-add /dev/sdb p 2048 -1 : part-set-bootable /dev/sdb 1 true \
  : mkfs btrfs /dev/sdb1 label:root : mount /dev/sdb1 / : btrfs-subvolume-create /@ : btrfs-subvolume-create /@home : umount / \
  : mount-options subvol=@ /dev/sdb1 / : mkdir /home : mount-options subvol=@home /dev/sdb1 /home \
  : tar-in "$cfg/root.tar" / xattrs:true "${lay[@]}" : write /home/ferry-home "the home subvolume" \
  : upload "$cfg/fstab" /etc/fstab : write /etc/hostname "ferry-guest-btrfs" \
  : command "sed -i -e s/ferry-guest-plain/ferry-guest-btrfs/ /etc/hosts" \
  : upload "$here/guest-ready-mounts.sh" /usr/local/sbin/ferry-guest-ready : chmod 0755 /usr/local/sbin/ferry-guest-ready \
  : upload "$cfg/ferry-firstboot" /usr/local/sbin/ferry-firstboot : chmod 0755 /usr/local/sbin/ferry-firstboot \
  : touch /etc/ferry-firstboot : command "systemctl enable ferry-firstboot.service" : sync
rm -f "$cfg/root.tar"

# The plain disk's initramfs (MODULES=dep for ext4) has no btrfs: the first boot uses debootstrap's (MODULES=most).
step "first boot on AHCI (grub-pc, grub.cfg, the initramfs with MODULES=dep; then it powers off)"
tar -xf "$rootfs" -C "$cfg" --wildcards './boot/vmlinuz-*' './boot/initrd.img-*'
accel=tcg; [ "${FERRY_GUESTFS_KVM:-}" = 1 ] && accel=kvm
timeout --kill-after=10 "${FERRY_FIRSTBOOT_TIMEOUT:-1800}" qemu-system-x86_64 \
  -machine "pc,accel=$accel" -m 1024 -smp 1 -nodefaults -display none -monitor none \
  -serial "file:$out/firstboot.log" -no-reboot \
  -kernel "$(ls "$cfg"/boot/vmlinuz-* | tail -n 1)" -initrd "$(ls "$cfg"/boot/initrd.img-* | tail -n 1)" \
  -append "root=/dev/sda1 rootflags=subvol=@ ro console=ttyS0,115200n8" \
  -device ahci,id=ahci0 -drive "file=$raw,format=raw,if=none,id=d0,cache=unsafe" -device ide-hd,drive=d0,bus=ahci0.0 \
  || { echo "btrfs.sh: the first boot did not power off in time (exit $?); console: $out/firstboot.log" >&2; tail -n 40 "$out/firstboot.log" >&2; exit 1; }
grep -q FERRY-FIRSTBOOT-DONE "$out/firstboot.log" \
  || { echo "btrfs.sh: the first boot did not finish; console: $out/firstboot.log" >&2; tail -n 40 "$out/firstboot.log" >&2; exit 1; }

step "checking the initramfs and the boot configuration"
guestfish --ro --format=raw -a "$raw" -- run : mount-options subvol=@,ro /dev/sda1 / \
  : download /initrd.img "$cfg/initrd.img" : download /boot/grub/grub.cfg "$cfg/grub.cfg"
lsinitramfs "$cfg/initrd.img" > "$cfg/initrd.list"
grep -q "/btrfs\.ko" "$cfg/initrd.list" || { echo "btrfs.sh: the initramfs has no btrfs" >&2; exit 1; }
for m in virtio_blk virtio_pci; do
  if grep -q "/$m\.ko" "$cfg/initrd.list"; then echo "btrfs.sh: the initramfs has $m" >&2; exit 1; fi
done
grep -q "root=/dev/sda1 .*rootflags=subvol=@ .*console=ttyS0" "$cfg/grub.cfg" \
  || { echo "btrfs.sh: grub.cfg does not boot root=/dev/sda1 rootflags=subvol=@ on ttyS0" >&2; exit 1; }

step "shipping as a streamOptimized VMDK"
qemu-img convert -f raw -O vmdk -o subformat=streamOptimized "$raw" "$out/disk.vmdk"
rm -f "$raw"
step "done: $out/disk.vmdk"
