#!/usr/bin/env bash
# Builds and tests the Go client (clients/go) offline, from the Go sources Debian installs: this machine
# reaches Debian's packages and npm, not the Go module proxy. The wiring lives here, not in go.mod,
# which stays a plain module anyone can `go get` (requiring github.com/nats-io/nats.go v1.22.1):
#
#   - installs golang-go and golang-github-nats-io-go-nats-dev (nats.go 1.22 with nkeys, nuid and
#     golang.org/x/*) when missing;
#   - writes a Go workspace (clients/go/.offline/go.work, ignored by git) that replaces every module of
#     the build graph by its directory under /usr/share/gocode/src; a source without a go.mod (nuid)
#     gets a shadow directory with one, and two modules x/text's go.mod names but no build uses
#     (x/tools, x/mod) get empty stand-ins;
#   - runs gofmt, go vet and go test with GOPROXY=off, so nothing is downloaded.
#
# go test starts its own coordinator (clients/go/main_test.go): it needs `npm ci` done in the
# repository, PostgreSQL and NATS with JetStream (scripts/ensure-services.sh), DATABASE_URL and NATS_URL
# as the TypeScript tests take them. Arguments go to `go test` (e.g. -run TestWithSlot -v).
set -euo pipefail
module_dir="$(cd "$(dirname "$0")/.." && pwd)"
gocode=/usr/share/gocode/src
say() { echo "clients/go/scripts/test.sh: $*" >&2; }

if ! command -v go >/dev/null 2>&1 || [ ! -f "$gocode/github.com/nats-io/nats.go/go.mod" ]; then
  say "installing golang-go and golang-github-nats-io-go-nats-dev (Debian)"
  packages=(golang-go golang-github-nats-io-go-nats-dev)
  apt-get install -y -q "${packages[@]}" >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && apt-get install -y -q "${packages[@]}" >/dev/null; }
fi

if grep -q '^replace' "$module_dir/go.mod"; then
  say "go.mod has a replace directive: the offline wiring belongs in this script, not in go.mod"
  exit 1
fi

offline="$module_dir/.offline"
rm -rf "$offline"
mkdir -p "$offline"
{
  echo "go 1.19"
  echo
  echo "use $module_dir"
  echo
  echo "replace ("
  for module in github.com/nats-io/nats.go github.com/nats-io/nkeys github.com/nats-io/nuid \
    golang.org/x/crypto golang.org/x/net golang.org/x/sys golang.org/x/term golang.org/x/text; do
    source_dir="$gocode/$module"
    [ -d "$source_dir" ] || { say "missing $source_dir (Debian package golang-github-nats-io-go-nats-dev)"; exit 1; }
    if [ ! -f "$source_dir/go.mod" ]; then
      shadow="$offline/shadow/$module"
      mkdir -p "$shadow"
      for entry in "$source_dir"/*; do ln -s "$entry" "$shadow/"; done
      printf 'module %s\n\ngo 1.12\n' "$module" > "$shadow/go.mod"
      source_dir="$shadow"
    fi
    echo "	$module => $source_dir"
  done
  for module in golang.org/x/tools golang.org/x/mod; do
    mkdir -p "$offline/unused/$module"
    printf 'module %s\n\ngo 1.17\n' "$module" > "$offline/unused/$module/go.mod"
    echo "	$module => $offline/unused/$module"
  done
  echo ")"
} > "$offline/go.work"

export GOWORK="$offline/go.work" GOPROXY=off GOSUMDB=off GOFLAGS= GOTOOLCHAIN=local
cd "$module_dir"
unformatted="$(gofmt -l $(find . -path ./.offline -prune -o -name "*.go" -print))"
if [ -n "$unformatted" ]; then
  say "not gofmt-formatted: $unformatted"
  exit 1
fi
go vet ./...
go test -count=1 -timeout 120s "$@" ./...
