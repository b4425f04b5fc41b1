# Sourced by the layers whose guest installs packages on its first boot (netplan.sh, btrfs.sh).

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

# write_firstboot <file> <steps>: the first-boot script. apt installs /var/cache/ferry-debs (it orders the local
# packages by their pre-dependencies, python3 on python3-minimal, which dpkg -i of a set does not), then <steps>
# run; the output goes to ttyS0 in one piece with FERRY-FIRSTBOOT-DONE (the script disables itself) or
# FERRY-FIRSTBOOT-FAILED, and the guest powers off.
write_firstboot() {
  cat > "$1" <<EOF
#!/bin/sh
log=/var/log/ferry-firstboot.log
export DEBIAN_FRONTEND=noninteractive
if { apt-get install -y --no-install-recommends /var/cache/ferry-debs/*.deb && rm -rf /var/cache/ferry-debs \\
     && $2; } > \$log 2>&1; then
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
