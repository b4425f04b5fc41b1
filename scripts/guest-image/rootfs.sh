#!/usr/bin/env bash
# Debian 12 root file system for the guest fixture, as a tarball both disk variants unpack (debootstrap runs once).
# Usage: rootfs.sh <output.tar>. Everything the guest needs is installed here; build.sh only lays it on a disk.
set -euo pipefail
out=$1
mirror=${FERRY_DEBIAN_MIRROR:-http://deb.debian.org/debian}
work=$(mktemp -d "${out}.work.XXXXXX")
cleanup() {
  for m in proc sys dev/pts dev; do umount -l "$work/root/$m" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
# minbase plus what a VMware guest has: systemd as init, udev, a kernel, grub for BIOS, initramfs-tools, ifupdown
# with a static address, open-vm-tools, and lvm2 (the lvm variant's root; harmless on the plain one).
pkgs=systemd-sysv,udev,kmod,linux-image-amd64,grub-pc,initramfs-tools,zstd,ifupdown,iproute2,open-vm-tools,lvm2,e2fsprogs
DEBIAN_FRONTEND=noninteractive debootstrap --variant=minbase --include="$pkgs" bookworm "$work/root" "$mirror"
rm -rf "$work/root/var/cache/apt/archives/"*.deb "$work/root/var/lib/apt/lists/"*_Packages
tar -C "$work/root" --numeric-owner --xattrs -cf "$out.part" .
mv "$out.part" "$out"
