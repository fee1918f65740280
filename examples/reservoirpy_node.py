"""A reservoir built with reservoirpy, for `reslm frontier bench --reservoir rpy --import
examples/reservoirpy_node.py` (needs `pip install 'reslm[reservoirpy]'`): a 750-unit leaky reservoirpy
Reservoir node with its own sparse W and W_in, registered under the name "rpy". reslm steps the node's
own matrices in torch (reslm.reservoir.reservoirpy_node); each of the bench's seeds draws its node from
that seed, as reslm's ESN does. Pass a built node instead of the function to benchmark that one node
at every seed."""
from reservoirpy.nodes import Reservoir

from reslm.reservoir.reservoirpy_node import register


def node(seed: int) -> Reservoir:
    """The node for one seed: 750 units, leak rate 0.5, spectral radius 0.95, 10% connectivity."""
    return Reservoir(750, lr=0.5, sr=0.95, input_scaling=1.0, rc_connectivity=0.1, input_connectivity=0.2,
                     seed=seed)


register("rpy", node)
