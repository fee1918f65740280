"""A reservoir of your own, for `reslm frontier bench --reservoir ring --import examples/ring_esn.py`:
an echo state network whose recurrent matrix is a ring (a cycle reservoir: each unit feeds the next),
registered under the name "ring". The same class as the README's Python example."""
import torch

from reslm.reservoir import ESN, ESNConfig, RESERVOIRS


class RingESN(ESN):
    """An ESN whose W is a cycle: W[i+1, i] = spectral_radius, every other entry 0."""

    def __init__(self, cfg: ESNConfig):
        super().__init__(cfg)   # draws W_in (and a random W that the ring replaces) from cfg.seed
        self.W_T.copy_(cfg.spectral_radius * torch.roll(torch.eye(cfg.size), 1, dims=0))


RESERVOIRS["ring"] = (ESNConfig, RingESN)
