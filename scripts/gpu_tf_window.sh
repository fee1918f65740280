#!/usr/bin/env bash
# The paper's exact transformer protocol (32-character window context, Adam 1e-4 constant, batch 1024,
# 5 epochs on each full training shard, one cycle, test CE on the whole test shard after every
# shard-epoch) for the five tf presets of Table 1, all at once on one CUDA GPU, each stopped after
# DEADLINE seconds. A stopped run keeps its last checkpoint (at most a minute old):
# `reslm train --out DIR/NAME --resume` continues it on any machine.
#
#   scripts/gpu_tf_window.sh DIR [DEADLINE_S [extra `reslm train` flags...]]
#
# Each run goes to DIR/<preset>-window, its output to DIR/<preset>.log. fp32 throughout (CUDA's TF32
# matmuls, reslm.core.device.setup_cuda). Run from the repository root, with the dataset in
# ./data/shakespeare (`reslm data shakespeare`).
set -uo pipefail
out=${1:?usage: scripts/gpu_tf_window.sh DIR [DEADLINE_S [train flags...]]}
deadline=${2:-540}
shift $(( $# >= 2 ? 2 : 1 ))
py=${PYTHON:-python3}
presets=${PRESETS:-"tf-64-4-4 tf-72-8-8 tf-128-8-8 tf-356-8-8 tf-256-16-16"}
mkdir -p "$out"
for p in $presets; do
    timeout "$deadline" "$py" -m reslm.cli train --preset "$p" --out "$out/$p-window" --precision fp32 \
        --threads 2 --checkpoint-minutes 1 --no-progress "$@" > "$out/$p.log" 2>&1 &
done
wait
for p in $presets; do
    echo "== $p"; tail -n 2 "$out/$p.log"
done
