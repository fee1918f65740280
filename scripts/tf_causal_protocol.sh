#!/usr/bin/env bash
# The paper's transformer protocol in causal context mode, one preset after another on one CPU thread:
# Adam 1e-4 constant, 1,024 targets per step (32 chunks of 32 characters), 5 epochs on each full
# training shard, one cycle; the test CE after every shard-epoch on 65,536 evenly spread test
# positions and after the last on the whole test shard (each character from its 32 preceding ones).
#
#   scripts/tf_causal_protocol.sh DIR PRESET [PRESET...]
#
# Each run trains in DIR/<preset>-causal and is published to results/<preset>-causal when it finishes.
# The script can be stopped and started again at any time: a run resumes from its last checkpoint in
# DIR, or, published unfinished in results/ (by another machine), continues there in place; a
# finished published run is skipped.
set -euo pipefail
dir=${1:?usage: scripts/tf_causal_protocol.sh DIR PRESET [PRESET...]}
shift
reslm=${RESLM:-reslm}
for p in "$@"; do
    name="$p-causal"; out="$dir/$name"; pub="results/$name"
    if [ -f "$pub/summary.json" ] && grep -q '"finished": true' "$pub/summary.json"; then
        echo "skip $name (published)"; continue
    fi
    if [ ! -f "$out/checkpoint.pt" ] && [ -f "$pub/checkpoint.pt" ]; then   # published unfinished: continue it there
        "$reslm" train --out "$pub" --resume --threads 1 --no-progress
        continue
    fi
    resume=()
    [ -f "$out/config.json" ] && resume=(--resume)
    "$reslm" train --preset "$p" --context-mode causal --out "$out" "${resume[@]}" --eval-samples 65536 \
        --final-eval-samples 0 --threads 1 --no-progress
    "$reslm" publish "$out" "$pub"
done
