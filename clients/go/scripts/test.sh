#!/usr/bin/env bash
# Builds and tests the Go client (clients/go) offline, from the Go sources Debian installs: this machine
# reaches Debian's packages and npm, not the Go module proxy. The wiring lives here, not in go.mod,
# which stays a plain module anyone can `go get` (requiring github.com/nats-io/nats.go v1.22.1):
#
#   - installs golang-go and golang-github-nats-io-go-nats-dev (nats.go 1.22 with nkeys, nuid and
#     golang.org/x/*) when missing;
#   - writes a Go workspace (clients/go/.offline/go.work, ignored by git) that replaces every module of
#     the build graph by its directory under /usr/share/gocode/src (scripts/offline-replaces.sh, the
#     same replacements the README gives a project that uses the client);
#   - runs gofmt, go vet (also of the README's River worker, examples/river, build tag river_example),
#     scripts/fresh-module.sh (a new module requiring the client by a replace, built and run) and go
#     test with GOPROXY=off, so nothing is downloaded.
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
printf 'go 1.19\n\nuse %s\n' "$module_dir" > "$offline/go.work"
export GOWORK="$offline/go.work" GOPROXY=off GOSUMDB=off GOFLAGS= GOTOOLCHAIN=local
while read -r replacement; do
  go work edit -replace="$replacement" "$offline/go.work"
done < <(bash "$module_dir/scripts/offline-replaces.sh" "$offline")

cd "$module_dir"
unformatted="$(gofmt -l $(find . -path ./.offline -prune -o -name "*.go" -print))"
if [ -n "$unformatted" ]; then
  say "not gofmt-formatted: $unformatted"
  exit 1
fi
go vet ./...
# The README's River worker, against River's interfaces stubbed locally (River is not in Debian).
go vet -tags river_example ./examples/river/...
readme_worker="$(sed -n '/^type AnalysisArgs struct/,/^```$/p' README.md | sed '$d')"
example_worker="$(sed -n '/^type AnalysisArgs struct/,/^\/\/ README end$/p' examples/river/main.go | sed '$d')"
if [ "$readme_worker" != "$example_worker" ]; then
  say "README.md's River worker differs from examples/river/main.go's:"
  diff <(echo "$readme_worker") <(echo "$example_worker") >&2 || true
  exit 1
fi
# A fresh module that requires the client through a replace, built and run offline.
bash "$module_dir/scripts/fresh-module.sh"
go test -count=1 -timeout 120s "$@" ./...
