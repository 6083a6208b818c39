#!/usr/bin/env bash
# Runs the HA test (npm run test:ha: test/ha/) N times in a row (default 3) and keeps each run's
# figures (time unserved, commands answered `unavailable`, anything lost) as JSON lines in
# test/ha/results/<date>.jsonl, with how long each run took. Stops at the first failed run.
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-3}"
mkdir -p test/ha/results
results="test/ha/results/$(date -u +%Y-%m-%dT%H%M%SZ).jsonl"
export HA_RESULTS_FILE="$PWD/$results"
for run in $(seq 1 "$runs"); do
  started=$SECONDS
  npm run test:ha
  echo "{\"run\":${run},\"tookSeconds\":$((SECONDS - started)),\"commit\":\"$(git rev-parse --short HEAD)\"}" >>"$results"
done
echo "ha-runs: ${runs} runs passed; figures in ${results}" >&2
