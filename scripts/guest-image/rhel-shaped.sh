#!/usr/bin/env bash
# The RHEL-shaped variant of the Debian guest fixture, as a layer on the plain variant (same root file system,
# GRUB defaults, hostname scheme): the layout a RHEL/Rocky VM on VMware has, on Debian 12 packages.
# - MBR: /boot (ext4) on /dev/sda1; one PV on /dev/sda2 holding VG "rhel" with LVs root and home (XFS) and swap;
# - the kernel line names rd.lvm.lv=rhel/root rd.lvm.lv=rhel/swap and resume=/dev/mapper/rhel-swap: the initramfs
#   activates those two, and /home's LV is activated later by LVM's udev rules, which read the devices file;
# - dracut (not initramfs-tools) as the initramfs generator, host-only strict: built on AHCI, it holds no virtio;
# - LVM's devices file: use_devicesfile=1, /etc/lvm/devices/system.devices made by vgimportdevices on the SATA
#   disk (so LVM ignores a PV that shows up on another disk: on virtio /home's LV is never activated);
# - NetworkManager with a keyfile for the VMware NIC (ens192, static 10.0.2.15/24); ifupdown configures only lo.
# The packages (about 50) are installed by the guest's own apt in a chroot on this host (layer-lib.sh's
# native_install); what depends on the disk it boots from (the devices file, GRUB, the host-only dracut images) is
# done by the guest itself on a first boot from AHCI (the debootstrap initramfs, generic, boots it), bounded by
# FERRY_FIRSTBOOT_TIMEOUT, default 3600 s (at load 50 on 2 cores, 1800 s was not enough).
# Usage: rhel-shaped.sh <plain disk.vmdk> <rootfs.tar it was built from> <output dir>. Writes disk.vmdk, firstboot.log.
set -euo pipefail
plain=$1 rootfs=$2 out=$3
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=layer-lib.sh
. "$here/layer-lib.sh"
mkdir -p "$out"
raw="$out/disk.raw"
export LIBGUESTFS_BACKEND_SETTINGS=${LIBGUESTFS_BACKEND_SETTINGS:-force_tcg}
step() { echo "rhel-shaped.sh $(date -u +%T) $*" >&2; }

cfg=$(mktemp -d "$out/cfg.XXXXXX")
trap 'rm -rf "$cfg"' EXIT

step "fetching dracut, network-manager, xfsprogs and what the guest lacks for them (apt-get --download-only against the guest's dpkg status)"
for pkg in dracut network-manager xfsprogs; do fetch_for_guest "$rootfs" "$cfg/ferry-debs" "$pkg"; done
step "installing them into the guest's root at this host's speed (chroot)"
mkdir "$cfg/native"
native_install "$rootfs" "$cfg/ferry-debs" "$cfg/native"
mapfile -t lay < <(lay_native_install "$cfg/native")

# /home waits up to 5 min for its LV (systemd's default is 90 s): under TCG on a loaded machine the booted system's
# LVM activated it later than that and the boot ended in emergency mode.
cat > "$cfg/fstab" <<'EOF'
# /etc/fstab: static file system information (device names, as the VMware template had).
/dev/mapper/rhel-root  /      xfs   defaults  0  0
/dev/sda1              /boot  ext4  defaults  0  2
/dev/mapper/rhel-home  /home  xfs   defaults,x-systemd.device-timeout=5min  0  0
/dev/mapper/rhel-swap  none   swap  defaults  0  0
EOF
cat > "$cfg/interfaces" <<'EOF'
# NetworkManager configures the NIC (/etc/NetworkManager/system-connections/).
source /etc/network/interfaces.d/*

auto lo
iface lo inet loopback
EOF
cat > "$cfg/ens192.nmconnection" <<'EOF'
[connection]
id=ens192
uuid=5fb06bd0-0bb0-7ffb-45f1-d6edd65f3e03
type=ethernet
interface-name=ens192
autoconnect=true

[ethernet]

[ipv4]
method=manual
address1=10.0.2.15/24,10.0.2.2

[ipv6]
method=ignore
EOF
cat > "$cfg/grub" <<'EOF'
# Kernel and boot loader on the serial console; device names, not UUIDs; the LVs dracut activates named, as
# anaconda writes them.
GRUB_DEFAULT=0
GRUB_TIMEOUT=1
GRUB_DISTRIBUTOR=Debian
GRUB_CMDLINE_LINUX_DEFAULT=""
GRUB_CMDLINE_LINUX="resume=/dev/mapper/rhel-swap rd.lvm.lv=rhel/root rd.lvm.lv=rhel/swap console=tty0 console=ttyS0,115200n8"
GRUB_TERMINAL="console serial"
GRUB_SERIAL_COMMAND="serial --unit=0 --speed=115200"
GRUB_DISABLE_LINUX_UUID=true
GRUB_DISABLE_RECOVERY=true
EOF
# dracut host-only, strict: only the drivers of the hardware it is built on (AHCI, no virtio), as RHEL's default.
# dracut's qemu module is left out: on the build's qemu it would add virtio (it checks for a qemu hypervisor),
# which a host-only image built on VMware never has.
cat > "$cfg/hostonly.conf" <<'EOF'
hostonly="yes"
hostonly_mode="strict"
omit_dracutmodules+=" qemu "
EOF
# On the first boot: LVM's devices file from the SATA disk (Debian 12's lvm2 has vgimportdevices only as an lvm
# subcommand), GRUB on the disk, and each kernel's host-only image built here (an image the chroot's dracut hook may
# have made read this host's hardware) and listed for the checks below. Debian's dracut 059 does not copy LVM's
# devices file into the images, so the initramfs finds the root LV on any disk and only the booted system's LVM obeys
# the file. Drivers are counted by their module files: dracut's virtiofs module adds scripts named virtiofs to
# every image, which hold no driver.
cat > "$cfg/ferry-dracut-images" <<'EOF'
#!/bin/sh
for k in $(ls /lib/modules); do
  l=/root/initrd-$k.list
  dracut -f "/boot/initrd.img-$k" "$k" || exit 1
  lsinitrd "/boot/initrd.img-$k" > "$l" || exit 1
  echo "ferry-initrd $k virtio=$(grep -cE '/virtio(_[a-z]+)?\.ko' "$l") ahci=$(grep -c /ahci.ko "$l") xfs=$(grep -c /xfs.ko "$l") lvm=$(grep -c 'sbin/lvm$' "$l")"
done
EOF
write_firstboot "$cfg/ferry-firstboot" "sed -i -e 's/^\\([[:space:]]*\\)# use_devicesfile = 0/\\1use_devicesfile = 1/' /etc/lvm/lvm.conf \\
     && grep -q '^[[:space:]]*use_devicesfile = 1' /etc/lvm/lvm.conf && lvm vgimportdevices rhel && cat /etc/lvm/devices/system.devices \\
     && grub-install --target=i386-pc /dev/sda && update-grub && ferry-dracut-images && ls /boot"

step "copying the plain variant onto the RHEL layout: /boot, VG rhel with an XFS root and swap (libguestfs appliance)"
qemu-img create -q -f raw "$raw" 3G
guestfish -- add "$plain" readonly:true format:vmdk : add "$raw" format:raw : run \
  : mount-ro /dev/sda1 / : tar-out / "$cfg/root.tar" xattrs:true numericowner:true : umount / \
  : part-init /dev/sdb mbr : part-add /dev/sdb p 2048 1050623 : part-add /dev/sdb p 1050624 -1 \
  : part-set-bootable /dev/sdb 1 true : part-set-mbr-id /dev/sdb 2 0x8e \
  : pvcreate /dev/sdb2 : vgcreate rhel /dev/sdb2 : lvcreate swap rhel 128 : lvcreate home rhel 320 : lvcreate-free root rhel 100 \
  : mkfs ext4 /dev/sdb1 label:boot : mkfs xfs /dev/rhel/root : mkfs xfs /dev/rhel/home : mkswap /dev/rhel/swap \
  : mount /dev/rhel/root / : mkdir /boot : mount /dev/sdb1 /boot : mkdir /home : mount /dev/rhel/home /home \
  : tar-in "$cfg/root.tar" / xattrs:true "${lay[@]}" \
  : upload "$cfg/fstab" /etc/fstab : upload "$cfg/interfaces" /etc/network/interfaces : upload "$cfg/grub" /etc/default/grub \
  : mkdir-p /etc/NetworkManager/system-connections \
  : upload "$cfg/ens192.nmconnection" /etc/NetworkManager/system-connections/ens192.nmconnection \
  : chmod 0600 /etc/NetworkManager/system-connections/ens192.nmconnection \
  : mkdir-p /etc/dracut.conf.d : upload "$cfg/hostonly.conf" /etc/dracut.conf.d/10-hostonly.conf \
  : write /etc/hostname "ferry-guest-rhel-shaped" \
  : command "sed -i -e s/ferry-guest-plain/ferry-guest-rhel-shaped/ /etc/hosts" \
  : upload "$here/guest-ready-mounts.sh" /usr/local/sbin/ferry-guest-ready : chmod 0755 /usr/local/sbin/ferry-guest-ready \
  : upload "$cfg/ferry-dracut-images" /usr/local/sbin/ferry-dracut-images : chmod 0755 /usr/local/sbin/ferry-dracut-images \
  : upload "$cfg/ferry-firstboot" /usr/local/sbin/ferry-firstboot : chmod 0755 /usr/local/sbin/ferry-firstboot \
  : touch /etc/ferry-firstboot : command "systemctl enable ferry-firstboot.service" : sync
rm -f "$cfg/root.tar"

step "first boot on AHCI (the devices file, GRUB, host-only dracut images; then it powers off)"
# debootstrap's initramfs (initramfs-tools, every storage and file system driver, LVM) boots the new layout once.
tar -xf "$rootfs" -C "$cfg" --wildcards './boot/vmlinuz-*' './boot/initrd.img-*'
accel=tcg; [ "${FERRY_GUESTFS_KVM:-}" = 1 ] && accel=kvm
timeout --kill-after=10 "${FERRY_FIRSTBOOT_TIMEOUT:-3600}" qemu-system-x86_64 \
  -machine "pc,accel=$accel" -m 1024 -smp 1 -nodefaults -display none -monitor none \
  -serial "file:$out/firstboot.log" -no-reboot \
  -kernel "$(ls "$cfg"/boot/vmlinuz-* | tail -n 1)" -initrd "$(ls "$cfg"/boot/initrd.img-* | tail -n 1)" \
  -append "root=/dev/mapper/rhel-root ro console=ttyS0,115200n8" \
  -device ahci,id=ahci0 -drive "file=$raw,format=raw,if=none,id=d0,cache=unsafe" -device ide-hd,drive=d0,bus=ahci0.0 \
  || { echo "rhel-shaped.sh: the first boot did not power off in time (exit $?); console: $out/firstboot.log" >&2; tail -n 40 "$out/firstboot.log" >&2; exit 1; }
grep -q FERRY-FIRSTBOOT-DONE "$out/firstboot.log" \
  || { echo "rhel-shaped.sh: the first boot failed; console: $out/firstboot.log" >&2; tail -n 60 "$out/firstboot.log" >&2; exit 1; }

step "checking the images and the boot configuration"
# Every kernel's image: no virtio; AHCI, XFS and LVM in.
grep -E '^ferry-initrd ' "$out/firstboot.log" | tr -d '\r' > "$cfg/images"
[ -s "$cfg/images" ] || { echo "rhel-shaped.sh: the first boot listed no dracut image" >&2; exit 1; }
if grep -v ' virtio=0 ahci=[1-9][0-9]* xfs=[1-9][0-9]* lvm=[1-9]' "$cfg/images"; then
  echo "rhel-shaped.sh: an image is not host-only for AHCI with XFS and LVM (above)" >&2; exit 1
fi
grep -q 'IDTYPE=.*DEVNAME=/dev/sda2' "$out/firstboot.log" || { echo "rhel-shaped.sh: system.devices does not name /dev/sda2" >&2; exit 1; }
guestfish --ro --format=raw -a "$raw" -i -- download /boot/grub/grub.cfg "$cfg/grub.cfg" : is-file /usr/bin/dracut \
  : exists /usr/sbin/update-initramfs > "$cfg/tools"
[ "$(cat "$cfg/tools")" = "$(printf 'true\nfalse')" ] || { echo "rhel-shaped.sh: want dracut and no update-initramfs, got: $(cat "$cfg/tools")" >&2; exit 1; }
grep -q "root=/dev/mapper/rhel-root .*rd.lvm.lv=rhel/root .*console=ttyS0" "$cfg/grub.cfg" \
  || { echo "rhel-shaped.sh: grub.cfg does not boot root=/dev/mapper/rhel-root with rd.lvm.lv on ttyS0" >&2; exit 1; }

step "shipping as a streamOptimized VMDK"
qemu-img convert -f raw -O vmdk -o subformat=streamOptimized "$raw" "$out/disk.vmdk"
rm -f "$raw"
step "done: $out/disk.vmdk"
