#!/usr/bin/env bash
# Installs what Ferry needs on a fresh Debian machine with Node 20; each step is skipped when already done.
# What to install is scripts/programs.txt, the one list of every program Ferry, its tests, benchmarks and
# `npm start` run; after installing, each entry is checked again and a missing one stops the set-up by name.
# `scripts/setup.sh --check` only checks (exit 1 naming what is missing).
set -euo pipefail
cd "$(dirname "$0")/.."

# Programs in /usr/sbin and /sbin count even where a non-root PATH lacks them (libvirtd finds dnsmasq there).
export PATH="$PATH:/usr/sbin:/sbin"

present() { # one check: comma-separated program names, or an absolute path (a glob allowed)
  local name
  if [[ $1 == /* ]]; then compgen -G "$1" >/dev/null; return; fi
  IFS=, read -r -a names <<< "$1"
  for name in "${names[@]}"; do command -v "$name" >/dev/null || { missing_name=$name; return 1; }; done
}
wanted() { # the groups this run installs
  case $1 in
    base|given) return 0 ;;
    guestfs) [ "${FERRY_SETUP_GUESTFS:-1}" = 1 ] ;;
    libvirt) [ "${FERRY_SETUP_LIBVIRT:-1}" = 1 ] ;;
    *) echo "setup: $PROGRAMS: unknown group '$1'" >&2; exit 2 ;;
  esac
}
# Prints "check package group" for every entry this run wants.
PROGRAMS=${FERRY_PROGRAMS_FILE:-scripts/programs.txt}
entries() { grep -Ev '^\s*(#|$)' "$PROGRAMS" | while read -r check package group _; do wanted "$group" && echo "$check $package $group"; done; }

need_apt=() missing=()
while read -r check package group; do
  missing_name=$check
  present "$check" && continue
  if [ "$group" = given ]; then missing+=("$missing_name (install it first: ${package/-/see README})"); continue; fi
  [[ " ${need_apt[*]} " == *" $package "* ]] || need_apt+=("$package")
done < <(entries)
if [ ${#missing[@]} -gt 0 ]; then echo "setup: missing ${missing[*]}" >&2; exit 1; fi

if [ "${1:-}" = --check ]; then
  [ ${#need_apt[@]} -eq 0 ] && exit 0
  echo "setup: missing packages: ${need_apt[*]}" >&2; exit 1
fi

if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "setup: installing ${need_apt[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get -o DPkg::Lock::Timeout=900 install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  else
    echo "setup: please install as root: apt-get install -y --no-install-recommends ${need_apt[*]}" >&2
    exit 1
  fi
  # Read back: a package that installed but did not bring what the list expects is named here, not at the test.
  while read -r check package group; do
    missing_name=$check
    present "$check" || { echo "setup: '$missing_name' is still missing after installing $package" >&2; exit 1; }
  done < <(entries)
fi

# npm packages exactly as package-lock.json pins them: installed when missing or when the lock file changed since.
# A node_modules that is a link (a worktree sharing another checkout's packages) is never reinstalled from here:
# npm ci would empty the folder it points to, under every checkout that shares it.
if [ -L node_modules ] && [ package-lock.json -nt node_modules/.package-lock.json ]; then
  echo "setup: node_modules links to $(readlink node_modules), shared with another checkout: not reinstalled here (run npm ci there if package-lock.json changed)" >&2
elif [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  echo "setup: installing npm packages (npm ci)" >&2
  npm ci --no-audit --no-fund --loglevel=error
fi
