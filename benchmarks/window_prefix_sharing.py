"""Window-mode reservoir states with and without prefix sharing (reslm.reservoir.states), alternated in
one process on the first CHARS characters of a prepared character dataset, best of REPS each:

    python benchmarks/window_prefix_sharing.py [CHARS] [N] [REPS] [DATASET]
    python benchmarks/window_prefix_sharing.py 30000 500 3 data/shakespeare

Prints the seconds of every run, the reservoir rows each path stepped (counted, exact) and the ratio
of the best times (plain / shared: above 1, sharing is faster). The states of the two paths are
checked equal to fp32 rounding. One thread unless OMP_NUM_THREADS says otherwise.
"""
import sys
import time

import numpy as np
import torch

from reslm.data.chars import CharDataset
from reslm.reservoir import ESN, ESNConfig, shard_states


def main(chars: int = 30000, size: int = 500, reps: int = 3, dataset: str = "data/shakespeare") -> None:
    tokens = torch.from_numpy(np.asarray(CharDataset.load(dataset).tokens[:chars], dtype=np.int64))
    esn = ESN(ESNConfig(size=size, spectral_radius=0.9, input_scaling=2.0, seed=0))
    table = torch.randn(int(tokens.max()) + 1, esn.config.input_dim, generator=torch.Generator().manual_seed(0))
    rows, forward = [0], ESN.forward

    def counted(self, u, s0=None, work=None):
        rows[0] += u.shape[0] * u.shape[1]
        return forward(self, u, s0, work)

    ESN.forward = counted
    seconds, steps, states = {False: [], True: []}, {}, {}
    for _ in range(reps):
        for share in (False, True):
            rows[0] = 0
            t0 = time.perf_counter()
            states[share] = shard_states(esn, lambda i: table[i], tokens, mode="window", context=32,
                                         share_prefixes=share)
            seconds[share].append(time.perf_counter() - t0)
            steps[share] = rows[0]
            print(f"{'shared' if share else 'plain '}  {seconds[share][-1]:7.2f} s  {rows[0]:,} reservoir rows",
                  flush=True)
    torch.testing.assert_close(states[True], states[False], rtol=1e-5, atol=1e-6)
    print(f"N = {size}, {chars:,} characters: shared steps {steps[True] / steps[False]:.3f} of the plain path's "
          f"rows; best time plain / shared = {min(seconds[False]) / min(seconds[True]):.2f} "
          f"(torch threads: {torch.get_num_threads()})")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(*(int(a) for a in args[:3]), *args[3:4])
