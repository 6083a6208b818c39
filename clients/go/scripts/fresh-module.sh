#!/usr/bin/env bash
# The README's offline recipe, tried as a new project would: a fresh module in a temporary directory
# requires the client through a replace (the checkout's clients/go), replaces its dependencies by
# Debian's sources (scripts/offline-replaces.sh), then builds and runs a small program with
# GOPROXY=off. It prints the program's output and fails unless the program printed the partition the
# protocol gives (alice: 39 of 64).
set -euo pipefail
module_dir="$(cd "$(dirname "$0")/.." && pwd)"
client=github.com/quota-coordinator/quota-coordinator/clients/go
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export GOWORK=off GOPROXY=off GOSUMDB=off GOFLAGS= GOTOOLCHAIN=local
cd "$work"
go mod init example.com/worker >/dev/null 2>&1
cat > main.go <<'GO'
package main

import (
	"fmt"

	"github.com/quota-coordinator/quota-coordinator/clients/go/quota"
)

func main() {
	_, err := quota.New(nil, quota.Options{})
	fmt.Println(quota.Partition("alice", quota.DefaultPartitions), err != nil)
}
GO
go mod edit -require="$client@v0.0.0" -replace="$client=$module_dir"
while read -r replacement; do
  go mod edit -replace="$replacement"
done < <(bash "$module_dir/scripts/offline-replaces.sh" "$work/offline")

go build -mod=mod -o worker .
output="$(./worker)"
echo "clients/go/scripts/fresh-module.sh: a fresh module built with the client offline; it printed: $output" >&2
[ "$output" = "39 true" ] || { echo "fresh-module.sh: want \"39 true\"" >&2; exit 1; }
