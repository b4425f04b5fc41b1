#!/bin/sh
# The marker of the layered variants (netplan.sh, btrfs.sh), installed as /usr/local/sbin/ferry-guest-ready: as
# build.sh's, and every file system of fstab must be mounted too; it names them. Prints on ttyS0:
# FERRY-GUEST-READY iface=<name> addr=10.0.2.15 mounts=/,/data  or, after 180 s, FERRY-GUEST-NOT-READY <what it saw>.
addr=10.0.2.15
i=0
while [ $i -lt 180 ]; do
  rw=$(awk '$2 == "/" && $4 ~ /^rw(,|$)/ { print "rw" }' /proc/mounts | tail -n 1)
  iface=$(ip -o -4 addr show up | awk -v a="$addr/" 'index($4, a) == 1 { print $2; exit }')
  missing=$(awk '$1 !~ /^#/ && $2 ~ /^\// && $3 != "swap" { print $2 }' /etc/fstab | while read -r m; do mountpoint -q "$m" || printf '%s ' "$m"; done)
  if [ "$rw" = rw ] && [ -n "$iface" ] && [ -z "$missing" ] && ip -o link show dev "$iface" | grep -q 'state UP\|LOWER_UP'; then
    mounts=$(awk '$1 !~ /^#/ && $2 ~ /^\// && $3 != "swap" { print $2 }' /etc/fstab | paste -sd, -)
    echo "FERRY-GUEST-READY iface=$iface addr=$addr mounts=$mounts" > /dev/ttyS0
    exit 0
  fi
  i=$((i + 1)); sleep 1
done
echo "FERRY-GUEST-NOT-READY root=${rw:-ro} missing mounts: ${missing:-none} links: $(ip -o -4 addr show | awk '{ print $2 "=" $4 }' | tr '\n' ' ')" > /dev/ttyS0
exit 1
