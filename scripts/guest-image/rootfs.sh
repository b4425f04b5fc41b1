#!/usr/bin/env bash
# A Debian root file system for the guest fixture, as a tarball the disk variants of that release unpack
# (debootstrap runs once per release). Usage: rootfs.sh <output.tar> [bookworm|bullseye|trixie] (default bookworm:
# Debian 12, the release every layout variant is built on; bullseye and trixie are Debian 11 and 13's plain disks).
# Everything the guest needs is installed here; build.sh only lays it on a disk.
set -euo pipefail
out=$1 release=${2:-bookworm}
case $release in bookworm|bullseye|trixie) ;; *) echo "rootfs.sh: release must be bookworm, bullseye or trixie, not '$release'" >&2; exit 2 ;; esac
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
DEBIAN_FRONTEND=noninteractive debootstrap --variant=minbase --include="$pkgs" "$release" "$work/root" "$mirror"
rm -rf "$work/root/var/cache/apt/archives/"*.deb "$work/root/var/lib/apt/lists/"*_Packages
tar -C "$work/root" --numeric-owner --xattrs -cf "$out.part" .
mv "$out.part" "$out"
