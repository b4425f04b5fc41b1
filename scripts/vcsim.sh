#!/usr/bin/env bash
# Builds the vSphere API simulator (vcsim) the tests and the export benchmark run, from Debian's
# golang-github-vmware-govmomi-dev (0.24.2) with Debian's Go, offline: GOPATH mode, no module proxy.
# The binary is cached outside the clone, keyed by its inputs:
#   ${FERRY_CACHE_DIR:-$HOME/.cache/ferry}/vcsim-<hash>/vcsim
# Prints that path on stdout. scripts/setup.sh installs the two Debian packages.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src="$here/vcsim/main.go"
gocode=/usr/share/gocode
command -v go >/dev/null || { echo "vcsim.sh: go is missing (apt-get install golang-go)" >&2; exit 1; }
[ -d "$gocode/src/github.com/vmware/govmomi/simulator" ] || { echo "vcsim.sh: govmomi is missing (apt-get install golang-github-vmware-govmomi-dev)" >&2; exit 1; }

inputs="$(sha256sum "$src" "$0" | cut -d' ' -f1)
$(go version)
$(dpkg-query -W -f='${Package} ${Version}\n' golang-github-vmware-govmomi-dev 'golang-github-google-uuid-dev' 2>/dev/null || true)"
hash="$(printf '%s' "$inputs" | sha256sum | cut -c1-16)"
out="${FERRY_CACHE_DIR:-$HOME/.cache/ferry}/vcsim-$hash"
if [ -x "$out/vcsim" ]; then echo "$out/vcsim"; exit 0; fi

mkdir -p "$(dirname "$out")"
work="$(mktemp -d "$(dirname "$out")/.vcsim-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/gopath/src/ferry/vcsim"
cp "$src" "$work/gopath/src/ferry/vcsim/main.go"
echo "vcsim.sh: building vcsim from govmomi in $gocode (one time, about a minute)" >&2
( cd "$work/gopath/src/ferry/vcsim" &&
  env GO111MODULE=off GOPATH="$work/gopath:$gocode" GOFLAGS= GOPROXY=off GONOSUMDB= GOCACHE="$work/cache" \
    go build -trimpath -o "$work/bin/vcsim" . ) >&2
mkdir -p "$work/final" && mv "$work/bin/vcsim" "$work/final/vcsim"
# Atomic publish: concurrent builders race harmlessly, the first rename wins.
mv -T "$work/final" "$out" 2>/dev/null || true
[ -x "$out/vcsim" ] || { echo "vcsim.sh: build produced no binary" >&2; exit 1; }
echo "$out/vcsim"
