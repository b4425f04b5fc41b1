#!/usr/bin/env bash
# Installs what Ferry needs on a fresh Debian machine with Node 20; each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v redis-server >/dev/null || need_apt+=(redis-server)
command -v qemu-img >/dev/null || need_apt+=(qemu-utils)
# deploy checks (issue 5): promtool/prometheus for rules and dashboards, docker-compose to validate compose.yaml
command -v promtool >/dev/null || need_apt+=(prometheus)
command -v docker-compose >/dev/null || need_apt+=(docker-compose)
# browser dashboard test (issue 5): headless Chromium driven by playwright-core
command -v chromium >/dev/null || need_apt+=(chromium)
# the vSphere simulator (issue 10): scripts/vcsim.sh builds it offline from Debian's govmomi with Debian's Go
command -v go >/dev/null || need_apt+=(golang-go)
[ -d /usr/share/gocode/src/github.com/vmware/govmomi/simulator ] || need_apt+=(golang-github-vmware-govmomi-dev)
# the export test writes its own disks with qemu-img and fetches with curl in the export benchmark
command -v curl >/dev/null || need_apt+=(curl)
if [ "${FERRY_SETUP_GUESTFS:-1}" = 1 ]; then
  command -v guestfish >/dev/null || need_apt+=(libguestfs-tools)
  # a static /bin/sh for the test guest whose grub-mkconfig and update-initramfs really run inside it
  [ -x /bin/busybox ] || need_apt+=(busybox-static)
  # virt_test boots the converted disks with qemu directly
  command -v qemu-system-x86_64 >/dev/null || need_apt+=(qemu-system-x86)
  # XFS inside the appliance (xfs_regenerate_uuid, the XFS test disk): supermin takes it from the host's xfsprogs
  dpkg -s libguestfs-xfs >/dev/null 2>&1 || need_apt+=(libguestfs-xfs)
  # supermin builds the libguestfs appliance from the host's kernel: without one no appliance starts at all
  ls /boot/vmlinuz-* >/dev/null 2>&1 || need_apt+=(linux-image-amd64)
  # hivexregedit: the Windows fix writes registry values with it (guestfish cannot pass NUL bytes)
  command -v hivexregedit >/dev/null || need_apt+=(libwin-hivex-perl)
  # bsdtar unpacks a virtio-win ISO image (and the test makes one with it)
  command -v bsdtar >/dev/null || need_apt+=(libarchive-tools)
  command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || need_apt+=(openssh-server)
  command -v ssh >/dev/null || need_apt+=(openssh-client)
  # the Debian guest fixture (issue 12, scripts/guest-image/): debootstrap, and lsinitramfs to check its initramfs
  command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ] || need_apt+=(debootstrap)
  command -v lsinitramfs >/dev/null || need_apt+=(initramfs-tools-core)
  # npm run bench:guest compares with Debian's virt-v2v, which needs nbdkit and nbdinfo/nbdcopy without depending on them
  command -v virt-v2v >/dev/null || need_apt+=(virt-v2v)
  command -v nbdkit >/dev/null || need_apt+=(nbdkit)
  command -v nbdcopy >/dev/null || need_apt+=(libnbd-bin)
fi
if [ "${FERRY_SETUP_LIBVIRT:-1}" = 1 ]; then
  # The virtualization host (issue 11): libvirtd, virtlogd, virtlockd, virsh, virt-clone, UEFI firmware,
  # virt-sysprep/virt-customize, scrub for vol-wipe's algorithms, nc for qemu+ssh:// to a private socket.
  command -v libvirtd >/dev/null || need_apt+=(libvirt-daemon-system)
  command -v virsh >/dev/null || need_apt+=(libvirt-clients)
  command -v virt-clone >/dev/null || need_apt+=(virtinst)
  [ -e /usr/share/OVMF/OVMF_CODE_4M.fd ] || need_apt+=(ovmf)
  command -v virt-customize >/dev/null || need_apt+=(guestfs-tools)
  command -v scrub >/dev/null || need_apt+=(scrub)
  command -v nc >/dev/null || need_apt+=(netcat-openbsd)
  [ -x /usr/bin/python3 ] || need_apt+=(python3)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "setup: installing ${need_apt[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get -o DPkg::Lock::Timeout=900 install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  else
    echo "setup: please install as root: apt-get install -y ${need_apt[*]}" >&2
    exit 1
  fi
fi

# npm packages: install when missing or when package-lock.json changed since the last install (npm install,
# not npm ci: npm 11 lock files can miss optional platform packages, which makes npm ci refuse).
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  echo "setup: installing npm packages" >&2
  npm install --no-audit --no-fund --loglevel=error
fi
