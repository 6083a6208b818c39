#!/usr/bin/env bash
# Prints, one per line as `module=directory`, the replacements that build the Go client offline from the
# Go sources Debian installs (golang-github-nats-io-go-nats-dev: nats.go 1.22 with nkeys, nuid and
# golang.org/x/*), for `go mod edit -replace=LINE` or `go work edit -replace=LINE`:
#
#   bash clients/go/scripts/offline-replaces.sh DIR | while read -r r; do go mod edit -replace="$r"; done
#
# DIR (created) receives what Debian lacks: a shadow of a source without a go.mod (nuid) with one, and
# empty stand-ins for two modules x/text's go.mod names but no build uses (x/tools, x/mod). Keep DIR as
# long as the replacements are used.
set -euo pipefail
gocode=/usr/share/gocode/src
out="${1:?usage: offline-replaces.sh DIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
for module in github.com/nats-io/nats.go github.com/nats-io/nkeys github.com/nats-io/nuid \
  golang.org/x/crypto golang.org/x/net golang.org/x/sys golang.org/x/term golang.org/x/text; do
  source_dir="$gocode/$module"
  [ -d "$source_dir" ] || { echo "offline-replaces.sh: missing $source_dir (apt-get install golang-github-nats-io-go-nats-dev)" >&2; exit 1; }
  if [ ! -f "$source_dir/go.mod" ]; then
    shadow="$out/shadow/$module"
    rm -rf "$shadow"
    mkdir -p "$shadow"
    for entry in "$source_dir"/*; do ln -s "$entry" "$shadow/"; done
    printf 'module %s\n\ngo 1.12\n' "$module" > "$shadow/go.mod"
    source_dir="$shadow"
  fi
  echo "$module=$source_dir"
done
for module in golang.org/x/tools golang.org/x/mod; do
  mkdir -p "$out/unused/$module"
  printf 'module %s\n\ngo 1.17\n' "$module" > "$out/unused/$module/go.mod"
  echo "$module=$out/unused/$module"
done
