#!/usr/bin/env bash
# Cross-layer speculative prefetch measured by `sparsekv replay --crosslayer-prefetch` (CPU only):
# the recorded SmolLM2 trace, the calibrated generator (default cross-layer overlap) and the
# uncorrelated worst case (overlap 0), then the combined summary. Run from the repository root.
set -euo pipefail
S=${SPARSEKV:-build/tools/sparsekv/sparsekv}
D=bench/results/2026-12-01-crosslayer
$S replay --trace bench/results/traces/smollm2-135m-gpl3.skvt \
  --hot-slots 64,128,256 --policies lru,slru --window-split 0 --layer-overlap \
  --crosslayer-prefetch --json $D/trace.json
for overlap in default 0; do
  name=calibrated; extra=()
  if [[ $overlap == 0 ]]; then name=uncorrelated; extra=(--cross-layer-overlap 0); fi
  $S replay --synthetic-locality calibrated --layers 8 --steps 64 --warmup 24 --context 32768 \
    --hot-slots 2048,4096,8192 --policies lru,slru --window-split 0 --layer-overlap \
    "${extra[@]}" --crosslayer-prefetch --json $D/$name.json
done
jq -n --slurpfile t $D/trace.json --slurpfile c $D/calibrated.json \
  --slurpfile u $D/uncorrelated.json '
  def keys($s; $suffix): $s[0].summary | with_entries(select(.key | startswith("crosslayer_")))
    | with_entries(.key += $suffix);
  {summary: (keys($t; "") + keys($c; "_calibrated") + keys($u; "_uncorrelated")),
   runs: {trace: $t[0].crosslayer_prefetch, calibrated: $c[0].crosslayer_prefetch,
          uncorrelated: $u[0].crosslayer_prefetch}}' > $D/crosslayer.json
