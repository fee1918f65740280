"""Test-wide settings. The tests use tiny models, which gain nothing from intra-op threads; one
thread also keeps them fast when another process is busy on the same cores (OpenMP worker threads
otherwise spin-wait for each other)."""
import torch

torch.set_num_threads(1)
