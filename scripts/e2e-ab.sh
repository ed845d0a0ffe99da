#!/usr/bin/env bash
# Two builds of dra-scheduler on benches/e2e, alternating one round each, so that a change
# is compared with what it changed on the same machine at the same time.
#
#   scripts/e2e-ab.sh OLD_BINARY NEW_BINARY ROUNDS OUTDIR [WORKLOADS]
#
# OLD_BINARY/NEW_BINARY: dra-scheduler binaries (e.g. `cargo build --profile bench --bin
# dra-scheduler` in a worktree of each commit). Builds benches/e2e first; each run's report
# goes to OUTDIR/{old,new}-ROUND (report.md, results.json). WORKLOADS: E2E_WORKLOADS
# (default template,steady). The bench's own dra-scheduler binary is put back at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
old=$1 new=$2 rounds=$3 out=$4 workloads=${5:-template,steady}
bench=$(cargo bench --bench e2e --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]=="e2e" and m.get("executable"): print(m["executable"])')
target=target/release/dra-scheduler
mkdir -p "$out"
cp "$target" "$out/bench-bin"
cp "$old" "$out/old-bin"
cp "$new" "$out/new-bin"
for r in $(seq 1 "$rounds"); do
  for which in old new; do
    cp "$out/$which-bin" "$target"
    echo "== round $r $which $(date +%T)"
    E2E_WORKLOADS=$workloads E2E_RUNNERS=dra-scheduler E2E_PLOT=0 E2E_REPORT="$out/$which-$r" \
      "$bench" --bench > "$out/$which-$r.log" 2>&1 || echo "FAILED $which $r"
  done
done
cp "$out/bench-bin" "$target"
