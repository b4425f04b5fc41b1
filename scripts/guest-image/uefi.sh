#!/usr/bin/env bash
# The UEFI variant of the Debian guest fixture, as a layer on the plain variant (same root file system, marker,
# ifupdown and GRUB defaults): GPT, an EFI system partition named /dev/sda1 in fstab, the root on /dev/sda2,
# grub-efi-amd64 installed by the guest itself with an NVRAM boot entry and no fallback loader (\EFI\BOOT), as a
# VMware UEFI VM has it. The NVRAM is shipped beside the disk: the source boots only with it.
# Usage: uefi.sh <plain disk.vmdk> <rootfs.tar it was built from> <output dir>. Writes <output dir>/disk.vmdk,
# nvram.fd, firstboot.log.
set -euo pipefail
plain=$1 rootfs=$2 out=$3
mkdir -p "$out"
raw="$out/disk.raw"
export LIBGUESTFS_BACKEND_SETTINGS=${LIBGUESTFS_BACKEND_SETTINGS:-force_tcg}
OVMF_CODE=${FERRY_OVMF_CODE:-/usr/share/OVMF/OVMF_CODE_4M.fd}
OVMF_VARS=${FERRY_OVMF_VARS:-/usr/share/OVMF/OVMF_VARS_4M.fd}
step() { echo "uefi.sh $(date -u +%T) $*" >&2; }

cfg=$(mktemp -d "$out/cfg.XXXXXX")
trap 'rm -rf "$cfg"' EXIT

# The guest has no network at build time: the EFI boot loader's packages come from this host's apt sources (the
# same bookworm mirror as the root file system), pinned to the guest's grub-common version.
step "fetching grub-efi-amd64 and efibootmgr with apt-get download"
mkdir "$cfg/ferry-debs"
# awk reads to the end: an early exit would kill tar with SIGPIPE, which pipefail makes the script's failure.
grubv=$(tar -xOf "$rootfs" ./var/lib/dpkg/status | awk '/^Package: grub-common$/ { p = 1 } p && /^Version: / && !v { v = $2 } END { print v }')
[ -n "$grubv" ] || { echo "uefi.sh: no grub-common in $rootfs" >&2; exit 1; }
(cd "$cfg/ferry-debs" && apt-get download -q "grub-efi-amd64=$grubv" "grub-efi-amd64-bin=$grubv" efibootmgr libpopt0 >&2)

# The ESP's device wait is raised from systemd's 90 s: under TCG on a loaded machine udev can take longer to
# announce /dev/sda1, and /boot/efi is required for boot (the first build went to emergency mode that way).
cat > "$cfg/fstab" <<'EOF'
# /etc/fstab: static file system information (device names, as the VMware template had).
/dev/sda2  /          ext4  errors=remount-ro                      0  1
/dev/sda1  /boot/efi  vfat  umask=0077,x-systemd.device-timeout=10min  0  1
EOF
# First boot only (from AHCI under OVMF): grub-pc replaced by grub-efi, grub-install writes \EFI\debian and the
# NVRAM entry (efivarfs is there because the guest booted under UEFI), then grub.cfg and the initramfs. grub-pc is
# removed, not purged, and /etc/default/grub put back: a purge deletes it and grub-efi would install its own
# (root=UUID, quiet, no serial console), which is not the VMware template's.
cat > "$cfg/ferry-firstboot" <<'EOF'
#!/bin/sh
log=/var/log/ferry-firstboot.log
export DEBIAN_FRONTEND=noninteractive
cp /etc/default/grub /root/default-grub
if { dpkg --remove grub-pc && dpkg -i /var/cache/ferry-debs/*.deb && rm -rf /var/cache/ferry-debs \
     && cp /root/default-grub /etc/default/grub && rm /root/default-grub \
     && grub-install --target=x86_64-efi --efi-directory=/boot/efi --bootloader-id=debian \
     && update-grub && update-initramfs -u -k all && efibootmgr -v; } > $log 2>&1; then
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

step "copying the plain variant onto a GPT disk with an ESP (libguestfs appliance)"
qemu-img create -q -f raw "$raw" 3G
guestfish -- add "$plain" readonly:true format:vmdk : add "$raw" format:raw : run \
  : mount-ro /dev/sda1 / : tar-out / "$cfg/root.tar" xattrs:true numericowner:true : umount / \
  : part-init /dev/sdb gpt : part-add /dev/sdb p 2048 206847 : part-add /dev/sdb p 206848 -34 \
  : part-set-gpt-type /dev/sdb 1 C12A7328-F81F-11D2-BA4B-00A0C93EC93B : part-set-name /dev/sdb 1 EFI \
  : mkfs vfat /dev/sdb1 : mkfs ext4 /dev/sdb2 label:root : mount /dev/sdb2 / \
  : tar-in "$cfg/root.tar" / xattrs:true : mkdir-p /boot/efi \
  : upload "$cfg/fstab" /etc/fstab : write /etc/hostname "ferry-guest-uefi" \
  : command "sed -i -e s/ferry-guest-plain/ferry-guest-uefi/ /etc/hosts" \
  : copy-in "$cfg/ferry-debs" /var/cache \
  : upload "$cfg/ferry-firstboot" /usr/local/sbin/ferry-firstboot : chmod 0755 /usr/local/sbin/ferry-firstboot \
  : touch /etc/ferry-firstboot : command "systemctl enable ferry-firstboot.service" \
  : download /vmlinuz "$cfg/vmlinuz" : download /initrd.img "$cfg/initrd.img" : sync
rm -f "$cfg/root.tar"

step "first boot on AHCI under OVMF (grub-efi, the NVRAM entry, grub.cfg, the initramfs; then it powers off)"
cp "$OVMF_VARS" "$out/nvram.fd"
accel=tcg; [ "${FERRY_GUESTFS_KVM:-}" = 1 ] && accel=kvm
timeout --kill-after=10 "${FERRY_FIRSTBOOT_TIMEOUT:-1500}" qemu-system-x86_64 \
  -machine "q35,accel=$accel" -m 1024 -smp 1 -nodefaults -display none -monitor none \
  -serial "file:$out/firstboot.log" -no-reboot \
  -drive "if=pflash,format=raw,unit=0,readonly=on,file=$OVMF_CODE" -drive "if=pflash,format=raw,unit=1,file=$out/nvram.fd" \
  -kernel "$cfg/vmlinuz" -initrd "$cfg/initrd.img" -append "root=/dev/sda2 ro console=ttyS0,115200n8" \
  -device ahci,id=ahci0 -drive "file=$raw,format=raw,if=none,id=d0,cache=unsafe" -device ide-hd,drive=d0,bus=ahci0.0 \
  || { echo "uefi.sh: the first boot did not power off in time (exit $?); console: $out/firstboot.log" >&2; tail -n 40 "$out/firstboot.log" >&2; exit 1; }
grep -q FERRY-FIRSTBOOT-DONE "$out/firstboot.log" \
  || { echo "uefi.sh: the first boot did not install grub-efi; console: $out/firstboot.log" >&2; tail -n 40 "$out/firstboot.log" >&2; exit 1; }
grep -Eq 'Boot[0-9A-F]{4}\* debian' "$out/firstboot.log" || { echo "uefi.sh: efibootmgr shows no debian entry in the NVRAM" >&2; exit 1; }

step "checking the ESP and the boot configuration"
guestfish --ro --format=raw -a "$raw" -i -- is-file /boot/efi/EFI/debian/grubx64.efi : exists /boot/efi/EFI/BOOT \
  : download /boot/grub/grub.cfg "$cfg/grub.cfg" > "$cfg/esp"
[ "$(cat "$cfg/esp")" = "$(printf 'true\nfalse')" ] || { echo "uefi.sh: want \\EFI\\debian\\grubx64.efi and no \\EFI\\BOOT, got: $(cat "$cfg/esp")" >&2; exit 1; }
grep -q "root=/dev/sda2 .*console=ttyS0" "$cfg/grub.cfg" || { echo "uefi.sh: grub.cfg does not boot root=/dev/sda2 on ttyS0" >&2; exit 1; }

step "shipping as a streamOptimized VMDK"
qemu-img convert -f raw -O vmdk -o subformat=streamOptimized "$raw" "$out/disk.vmdk"
rm -f "$raw"
step "done: $out/disk.vmdk, $out/nvram.fd"
