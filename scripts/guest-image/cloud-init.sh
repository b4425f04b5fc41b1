#!/usr/bin/env bash
# The cloud-init variant of the Debian guest fixture, as a layer on the plain variant (same root, boot loader and
# MODULES=dep initramfs): cloud-init owns the network. Its NoCloud seed (/var/lib/cloud/seed/nocloud, as a template
# VM's datasource) names ens192 with the static address; cloud-init renders it into netplan's
# /etc/netplan/50-cloud-init.yaml (systemd-networkd renderer), and it renders again at every boot
# (`updates: network: when: [boot]`, what the OpenStack and Azure datasources do by default), so a renamed NIC in
# the rendered file alone does not survive the next boot: cloud-init must be told to leave the network alone.
# ifupdown keeps only lo. cloud-init and netplan.io are installed by the guest's own apt in a chroot on this host
# (layer-lib.sh's native_install), and the guest runs cloud-init's local stage once on a first boot from AHCI, so the
# disk is one that has booted with cloud-init, as on VMware.
# Usage: cloud-init.sh <plain disk.vmdk> <rootfs.tar it was built from> <output dir>. Writes disk.vmdk, firstboot.log.
set -euo pipefail
plain=$1 rootfs=$2 out=$3
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=layer-lib.sh
. "$here/layer-lib.sh"
mkdir -p "$out"
raw="$out/disk.raw"
export LIBGUESTFS_BACKEND_SETTINGS=${LIBGUESTFS_BACKEND_SETTINGS:-force_tcg}
step() { echo "cloud-init.sh $(date -u +%T) $*" >&2; }

cfg=$(mktemp -d "$out/cfg.XXXXXX")
trap 'rm -rf "$cfg"' EXIT

step "fetching cloud-init, netplan.io and what the guest lacks for them (apt-get --download-only against the guest's dpkg status)"
for pkg in cloud-init netplan.io; do fetch_for_guest "$rootfs" "$cfg/ferry-debs" "$pkg"; done
step "installing them into the guest's root at this host's speed (chroot)"
mkdir "$cfg/native"
native_install "$rootfs" "$cfg/ferry-debs" "$cfg/native"
mapfile -t lay < <(lay_native_install "$cfg/native")

cat > "$cfg/interfaces" <<'EOF'
source /etc/network/interfaces.d/*

auto lo
iface lo inet loopback
EOF
cat > "$cfg/cloud.cfg" <<'EOF'
# The template's cloud-init: the NoCloud seed on the disk, netplan as the renderer, the network rendered at every
# boot from the datasource.
datasource_list: [NoCloud, None]
system_info:
  network:
    renderers: [netplan]
updates:
  network:
    when: [boot]
EOF
mkdir -p "$cfg/seed"
printf 'instance-id: ferry-guest-cloud-init-1\nlocal-hostname: ferry-guest-cloud-init\n' > "$cfg/seed/meta-data"
printf '#cloud-config\n{}\n' > "$cfg/seed/user-data"
cat > "$cfg/seed/network-config" <<'EOF'
version: 2
ethernets:
  ens192:
    addresses: [10.0.2.15/24]
    routes:
      - to: default
        via: 10.0.2.2
EOF
write_firstboot "$cfg/ferry-firstboot" "systemctl enable systemd-networkd.service && cloud-init init --local \\
     && cat /etc/netplan/50-cloud-init.yaml"

step "copying the plain variant, adding the packages, cloud-init's configuration and its seed (libguestfs appliance)"
qemu-img convert -f vmdk -O raw "$plain" "$raw"
guestfish -- add "$raw" format:raw : run : mount /dev/sda1 / "${lay[@]}" \
  : upload "$cfg/interfaces" /etc/network/interfaces \
  : mkdir-p /etc/cloud/cloud.cfg.d : upload "$cfg/cloud.cfg" /etc/cloud/cloud.cfg.d/90-vmware-template.cfg \
  : mkdir-p /var/lib/cloud/seed : copy-in "$cfg/seed" /var/lib/cloud/seed : mv /var/lib/cloud/seed/seed /var/lib/cloud/seed/nocloud \
  : write /etc/hostname "ferry-guest-cloud-init" : command "sed -i -e s/ferry-guest-plain/ferry-guest-cloud-init/ /etc/hosts" \
  : upload "$here/guest-ready-mounts.sh" /usr/local/sbin/ferry-guest-ready : chmod 0755 /usr/local/sbin/ferry-guest-ready \
  : upload "$cfg/ferry-firstboot" /usr/local/sbin/ferry-firstboot : chmod 0755 /usr/local/sbin/ferry-firstboot \
  : touch /etc/ferry-firstboot : command "systemctl enable ferry-firstboot.service" \
  : download /vmlinuz "$cfg/vmlinuz" : download /initrd.img "$cfg/initrd.img" : sync

step "first boot on AHCI (cloud-init's local stage renders the seed's network; then it powers off)"
accel=tcg; [ "${FERRY_GUESTFS_KVM:-}" = 1 ] && accel=kvm
timeout --kill-after=10 "${FERRY_FIRSTBOOT_TIMEOUT:-1800}" qemu-system-x86_64 \
  -machine "pc,accel=$accel" -m 1024 -smp 1 -nodefaults -display none -monitor none \
  -serial "file:$out/firstboot.log" -no-reboot \
  -kernel "$cfg/vmlinuz" -initrd "$cfg/initrd.img" -append "root=/dev/sda1 ro console=ttyS0,115200n8" \
  -device ahci,id=ahci0 -drive "file=$raw,format=raw,if=none,id=d0,cache=unsafe" -device ide-hd,drive=d0,bus=ahci0.0 \
  || { echo "cloud-init.sh: the first boot did not power off in time (exit $?); console: $out/firstboot.log" >&2; tail -n 40 "$out/firstboot.log" >&2; exit 1; }
grep -q FERRY-FIRSTBOOT-DONE "$out/firstboot.log" \
  || { echo "cloud-init.sh: the first boot did not run cloud-init's local stage; console: $out/firstboot.log" >&2; tail -n 40 "$out/firstboot.log" >&2; exit 1; }

step "checking cloud-init's rendered network and that it has run"
guestfish --ro --format=raw -a "$raw" -- run : mount-ro /dev/sda1 / \
  : is-file /usr/bin/cloud-init followsymlinks:true : is-dir /var/lib/cloud/instances/ferry-guest-cloud-init-1 \
  : download /etc/netplan/50-cloud-init.yaml "$cfg/rendered.yaml" > "$cfg/check"
[ "$(cat "$cfg/check")" = "$(printf 'true\ntrue')" ] || { echo "cloud-init.sh: want cloud-init installed and its instance, got: $(cat "$cfg/check")" >&2; exit 1; }
grep -q 'ens192' "$cfg/rendered.yaml" && grep -q '10.0.2.15/24' "$cfg/rendered.yaml" \
  || { echo "cloud-init.sh: 50-cloud-init.yaml does not hold ens192's address:" >&2; cat "$cfg/rendered.yaml" >&2; exit 1; }

step "shipping as a streamOptimized VMDK"
qemu-img convert -f raw -O vmdk -o subformat=streamOptimized "$raw" "$out/disk.vmdk"
rm -f "$raw"
step "done: $out/disk.vmdk"
