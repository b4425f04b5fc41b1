#!/usr/bin/env bash
# A Debian guest disk shaped as it lives on VMware (see docs/testing.md, "The Debian guest fixture"): Debian 12's
# plain and lvm layouts, and the plain one on Debian 11 and 13 (the release is the root file system's, from rootfs.sh).
# Usage: build.sh <plain|lvm> <rootfs.tar from rootfs.sh> <output dir>
# Writes <output dir>/disk.vmdk (streamOptimized) and <output dir>/firstboot.log (the first boot's serial console).
#
# Steps: (1) libguestfs lays the root file system on a sparse raw disk (MBR; plain: one ext4 root on sda1; lvm:
# /boot on sda1 and root on an LV) and writes the VMware-guest configuration. (2) The guest boots once under qemu
# TCG from an AHCI (SATA) disk, its own kernel and debootstrap's initramfs given to qemu directly: a first-boot
# unit installs grub-pc on the disk, writes grub.cfg and rebuilds the initramfs with MODULES=dep there, as on the
# VMware VM itself (in a chroot on this host or in the appliance, dep would pull virtio in, and grub-install in
# the appliance's chroot sees the appliance's own root disk), disables itself and powers off.
# (3) The initramfs is checked (no virtio_blk/virtio_pci, has ahci/sd_mod), then (4) shipped as a streamOptimized
# VMDK. No host loop devices or device-mapper are used.
set -euo pipefail
variant=$1 rootfs=$2 out=$3
case $variant in plain|lvm) ;; *) echo "build.sh: variant must be plain or lvm, not '$variant'" >&2; exit 2 ;; esac
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
raw="$out/disk.raw"
rm -f "$raw" "$out/disk.vmdk" "$out/firstboot.log"
export LIBGUESTFS_BACKEND=${LIBGUESTFS_BACKEND:-direct}
[ "${FERRY_GUESTFS_KVM:-}" = 1 ] || export LIBGUESTFS_BACKEND_SETTINGS=${LIBGUESTFS_BACKEND_SETTINGS:-force_tcg}
step() { echo "build.sh[$variant] $(date -u +%T) $*" >&2; }

# The guest's static address: qemu's user network (10.0.2.0/24), so the same disk also has a working network
# when a test gives it one.
ADDR=10.0.2.15
qemu-img create -q -f raw "$raw" 3G

if [ "$variant" = plain ]; then
  ROOTDEV=/dev/sda1
  layout=(
    part-init /dev/sda mbr : part-add /dev/sda p 2048 -1 : part-set-bootable /dev/sda 1 true
    : mkfs ext4 /dev/sda1 label:root : mount /dev/sda1 /
  )
  fstab="/dev/sda1  /  ext4  errors=remount-ro  0  1"
else
  ROOTDEV=/dev/mapper/vgferry-root
  # The RHEL-family layout: a small /boot partition by device name, the rest one PV with the root LV.
  layout=(
    part-init /dev/sda mbr : part-add /dev/sda p 2048 1050623 : part-add /dev/sda p 1050624 -1
    : part-set-bootable /dev/sda 1 true : part-set-mbr-id /dev/sda 2 0x8e
    : pvcreate /dev/sda2 : vgcreate vgferry /dev/sda2 : lvcreate-free root vgferry 100
    : mkfs ext4 /dev/sda1 label:boot : mkfs ext4 /dev/vgferry/root label:root
    : mount /dev/vgferry/root / : mkdir /boot : mount /dev/sda1 /boot
  )
  fstab="/dev/mapper/vgferry-root  /      ext4  errors=remount-ro  0  1
/dev/sda1                 /boot  ext4  defaults           0  2"
fi

cfg=$(mktemp -d "$out/cfg.XXXXXX")
trap 'rm -rf "$cfg"' EXIT
printf '%s\n' "# /etc/fstab: static file system information (device names, as the VMware template had)." "$fstab" > "$cfg/fstab"
cat > "$cfg/interfaces" <<EOF
# The VMware NIC (vmxnet3 in PCIe slot 192), static, as the Debian installer writes it.
source /etc/network/interfaces.d/*

auto lo
iface lo inet loopback

allow-hotplug ens192
iface ens192 inet static
	address $ADDR/24
	gateway 10.0.2.2
EOF
cat > "$cfg/grub" <<'EOF'
# Kernel and boot loader on the serial console; device names, not UUIDs (a hardened VMware template).
GRUB_DEFAULT=0
GRUB_TIMEOUT=1
GRUB_DISTRIBUTOR=Debian
GRUB_CMDLINE_LINUX_DEFAULT=""
GRUB_CMDLINE_LINUX="console=tty0 console=ttyS0,115200n8"
GRUB_TERMINAL="console serial"
GRUB_SERIAL_COMMAND="serial --unit=0 --speed=115200"
GRUB_DISABLE_LINUX_UUID=true
GRUB_DISABLE_RECOVERY=true
EOF
# The marker: once / is mounted read-write and an interface is up holding the static address, print which one.
cat > "$cfg/ferry-guest-ready" <<EOF
#!/bin/sh
addr=$ADDR
i=0
while [ \$i -lt 180 ]; do
  rw=\$(awk '\$2 == "/" && \$4 ~ /^rw(,|\$)/ { print "rw" }' /proc/mounts | tail -n 1)
  iface=\$(ip -o -4 addr show up | awk -v a="\$addr/" 'index(\$4, a) == 1 { print \$2; exit }')
  if [ "\$rw" = rw ] && [ -n "\$iface" ] && ip -o link show dev "\$iface" | grep -q 'state UP\|LOWER_UP'; then
    echo "FERRY-GUEST-READY iface=\$iface addr=\$addr" > /dev/ttyS0
    exit 0
  fi
  i=\$((i + 1)); sleep 1
done
echo "FERRY-GUEST-NOT-READY root=\${rw:-ro} links: \$(ip -o -4 addr show | awk '{ print \$2 "=" \$4 }' | tr '\n' ' ')" > /dev/ttyS0
exit 1
EOF
cat > "$cfg/ferry-guest-ready.service" <<'EOF'
[Unit]
Description=Ferry test marker: root read-write and the static address up
After=local-fs.target network.target
ConditionPathExists=!/etc/ferry-firstboot

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/ferry-guest-ready

[Install]
WantedBy=multi-user.target
EOF
# First boot only (on AHCI, from the build): the boot loader and the initramfs with MODULES=dep for the disk it
# really boots from.
cat > "$cfg/ferry-firstboot" <<'EOF'
#!/bin/sh
# The steps' output goes to a file and then to the console in one piece (the serial getty hangs up ttyS0).
log=/var/log/ferry-firstboot.log
if { grub-install --target=i386-pc /dev/sda && update-grub && update-initramfs -u -k all; } > $log 2>&1; then
  rm -f /etc/ferry-firstboot
  systemctl disable ferry-firstboot.service >> $log 2>&1
  sync
  { cat $log; echo "FERRY-FIRSTBOOT-DONE"; } > /dev/ttyS0
else
  rc=$?
  { cat $log; echo "FERRY-FIRSTBOOT-FAILED exit $rc"; } > /dev/ttyS0
fi
systemctl poweroff
EOF
cat > "$cfg/ferry-firstboot.service" <<'EOF'
[Unit]
Description=Ferry fixture build: boot loader and initramfs on the SATA disk, then power off
After=local-fs.target
ConditionPathExists=/etc/ferry-firstboot

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/ferry-firstboot

[Install]
WantedBy=multi-user.target
EOF

step "laying out the disk (libguestfs appliance)"
guestfish --format=raw -a "$raw" -- run : "${layout[@]}" \
  : tar-in "$rootfs" / xattrs:true \
  : upload "$cfg/fstab" /etc/fstab \
  : upload "$cfg/interfaces" /etc/network/interfaces \
  : upload "$cfg/grub" /etc/default/grub \
  : write /etc/hostname "ferry-guest-$variant" \
  : write /etc/hosts "127.0.0.1 localhost
127.0.1.1 ferry-guest-$variant
" \
  : command "sed -i -e s/^MODULES=.*/MODULES=dep/ /etc/initramfs-tools/initramfs.conf" \
  : upload "$cfg/ferry-guest-ready" /usr/local/sbin/ferry-guest-ready : chmod 0755 /usr/local/sbin/ferry-guest-ready \
  : upload "$cfg/ferry-guest-ready.service" /etc/systemd/system/ferry-guest-ready.service \
  : upload "$cfg/ferry-firstboot" /usr/local/sbin/ferry-firstboot : chmod 0755 /usr/local/sbin/ferry-firstboot \
  : upload "$cfg/ferry-firstboot.service" /etc/systemd/system/ferry-firstboot.service \
  : touch /etc/ferry-firstboot \
  : command "systemctl enable ferry-guest-ready.service ferry-firstboot.service open-vm-tools.service" \
  : sync

step "first boot on AHCI under qemu (grub-pc, grub.cfg, the initramfs with MODULES=dep; then it powers off)"
tar -xf "$rootfs" -C "$cfg" --wildcards './boot/vmlinuz-*' './boot/initrd.img-*'
accel=tcg; [ "${FERRY_GUESTFS_KVM:-}" = 1 ] && accel=kvm
# Bounded: a boot that hangs is killed and the build fails with the console log.
timeout --kill-after=10 "${FERRY_FIRSTBOOT_TIMEOUT:-1500}" qemu-system-x86_64 \
  -machine "pc,accel=$accel" -m 1024 -smp 1 -nodefaults -display none -monitor none \
  -serial "file:$out/firstboot.log" -no-reboot \
  -kernel "$(ls "$cfg"/boot/vmlinuz-* | tail -n 1)" -initrd "$(ls "$cfg"/boot/initrd.img-* | tail -n 1)" \
  -append "root=$ROOTDEV ro console=ttyS0,115200n8" \
  -device ahci,id=ahci0 -drive "file=$raw,format=raw,if=none,id=d0,cache=unsafe" -device ide-hd,drive=d0,bus=ahci0.0 \
  || { echo "build.sh: the first boot did not power off in time (exit $?); console: $out/firstboot.log" >&2; tail -n 40 "$out/firstboot.log" >&2; exit 1; }
grep -q FERRY-FIRSTBOOT-DONE "$out/firstboot.log" \
  || { echo "build.sh: the first boot did not rebuild the initramfs; console: $out/firstboot.log" >&2; tail -n 40 "$out/firstboot.log" >&2; exit 1; }

step "checking the initramfs and the boot configuration"
# The kernel's own image by name: Debian 13's kernel package may leave no /initrd.img link in /.
kver=$(basename "$(ls "$cfg"/boot/vmlinuz-* | tail -n 1)"); kver=${kver#vmlinuz-}
guestfish --ro --format=raw -a "$raw" -i -- download "/boot/initrd.img-$kver" "$cfg/initrd.img" : download /boot/grub/grub.cfg "$cfg/grub.cfg" \
  : download /etc/initramfs-tools/initramfs.conf "$cfg/initramfs.conf"
lsinitramfs "$cfg/initrd.img" > "$cfg/initrd.list"
for m in virtio_blk virtio_pci; do
  if grep -q "/$m\.ko" "$cfg/initrd.list"; then echo "build.sh: the initramfs still has $m" >&2; exit 1; fi
done
for m in ahci sd_mod; do
  grep -q "/$m\.ko" "$cfg/initrd.list" || { echo "build.sh: the initramfs has no $m" >&2; exit 1; }
done
grep -q "^MODULES=dep" "$cfg/initramfs.conf" || { echo "build.sh: MODULES=dep did not hold" >&2; exit 1; }
grep -q "root=$ROOTDEV .*console=ttyS0" "$cfg/grub.cfg" || { echo "build.sh: grub.cfg does not boot root=$ROOTDEV on ttyS0" >&2; exit 1; }

step "shipping as a streamOptimized VMDK"
qemu-img convert -f raw -O vmdk -o subformat=streamOptimized "$raw" "$out/disk.vmdk"
rm -f "$raw"
step "done: $out/disk.vmdk ($(du -h "$out/disk.vmdk" | cut -f1))"
