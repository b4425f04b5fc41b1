# Sourced by the layers that add packages to the plain guest (netplan.sh, btrfs.sh, cloud-init.sh, rhel-shaped.sh).

# fetch_for_guest <rootfs.tar> <dir> <package>: the guest has no network at build time, so this host's apt (the
# same bookworm mirror) resolves <package> against the guest's own dpkg status and downloads what the guest lacks.
fetch_for_guest() {
  local rootfs=$1 dir=$2 pkg=$3 status
  status=$(mktemp)
  tar -xOf "$rootfs" ./var/lib/dpkg/status > "$status"
  mkdir -p "$dir/partial"
  apt-get install -q -y --no-install-recommends --download-only -o Debug::NoLocking=1 \
    -o Dir::State::status="$status" -o Dir::Cache::archives="$dir" "$pkg" >&2
  rmdir "$dir/partial"
  rm -f "$status"
  ls "$dir/${pkg}"_*.deb > /dev/null
}

# native_install <rootfs.tar> <debs dir> <out dir>: the guest's packages installed at this host's speed instead of
# under TCG on the guest's first boot (issue 32 item 5). rootfs.tar (the guest's root as debootstrap left it: the
# plain disk adds no package to it) is unpacked in <out dir>/tree, and the guest's own apt installs <debs> there in a
# chroot, with no daemon started (policy-rc.d) and no initramfs built: the guest builds its own for the disk it boots
# from on its first boot (in a chroot, MODULES=dep and dracut's host-only mode would read this host's hardware).
# What that changed is left as <out dir>/changed.tar (every path whose inode changed, without recursion) and
# <out dir>/removed (the paths gone, e.g. initramfs-tools' when dracut replaces it), for lay_native_install.
native_install() {
  local rootfs=$1 debs=$2 out=$3 tree conf
  tree="$out/tree"
  conf="$tree/etc/initramfs-tools/update-initramfs.conf"
  mkdir -p "$tree"
  tar -C "$tree" --numeric-owner --xattrs --xattrs-include='*' -xf "$rootfs"
  (cd "$tree" && find . -mindepth 1 | sort) > "$out/before"
  touch "$out/stamp"
  mkdir "$tree/var/cache/ferry-debs"
  cp "$debs"/*.deb "$tree/var/cache/ferry-debs/"
  printf '#!/bin/sh\nexit 101\n' > "$tree/usr/sbin/policy-rc.d"
  chmod 0755 "$tree/usr/sbin/policy-rc.d"
  cp -p "$conf" "$out/update-initramfs.conf"
  sed -i -e 's/^update_initramfs=.*/update_initramfs=no/' "$conf"
  chroot "$tree" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    sh -c 'apt-get install -q -y --no-install-recommends -o Dpkg::Use-Pty=0 /var/cache/ferry-debs/*.deb' >&2
  rm -rf "$tree/var/cache/ferry-debs" "$tree/usr/sbin/policy-rc.d"
  # Put back as it was, unless dracut's swap removed it with initramfs-tools.
  if [ -e "$conf" ]; then cp -p "$out/update-initramfs.conf" "$conf"; fi
  (cd "$tree" && find . -mindepth 1 | sort) > "$out/after"
  comm -23 "$out/before" "$out/after" | sed -e 's/^\.//' > "$out/removed"
  (cd "$tree" && find . -mindepth 1 -cnewer "$out/stamp" | sort) > "$out/changed"
  tar -C "$tree" --numeric-owner --xattrs --xattrs-include='*' --no-recursion -cf "$out/changed.tar" -T "$out/changed"
  rm -rf "$tree"
  echo "native_install: $(wc -l < "$out/changed") paths changed, $(wc -l < "$out/removed") removed" >&2
}

# lay_native_install <out dir of native_install>: the guestfish commands, each after a `:`, that lay the packages'
# changes on the guest's mounted root: the removed paths first, then the changed ones. Read them into an array.
lay_native_install() {
  local p
  while IFS= read -r p; do printf '%s\n' : rm-rf "$p"; done < "$1/removed"
  printf '%s\n' : tar-in "$1/changed.tar" / xattrs:true
}

# write_firstboot <file> <steps>: the first-boot script (the packages are already on the disk: native_install).
# <steps> run; their output goes to ttyS0 in one piece with FERRY-FIRSTBOOT-DONE (the script disables itself) or
# FERRY-FIRSTBOOT-FAILED, and the guest powers off.
write_firstboot() {
  cat > "$1" <<EOF
#!/bin/sh
log=/var/log/ferry-firstboot.log
export DEBIAN_FRONTEND=noninteractive
if { $2; } > \$log 2>&1; then
  rm -f /etc/ferry-firstboot
  systemctl disable ferry-firstboot.service >> \$log 2>&1
  sync
  { cat \$log; echo "FERRY-FIRSTBOOT-DONE"; } > /dev/ttyS0
else
  rc=\$?
  { cat \$log; echo "FERRY-FIRSTBOOT-FAILED exit \$rc"; } > /dev/ttyS0
fi
systemctl poweroff
EOF
}
