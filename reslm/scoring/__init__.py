"""What a trained run is worth: its test CE and sample (evaluate), the scoring's progress kept piece by piece
(pieces), a published figure re-scored from its weights (verify), CE by how many symbols a target is read
from (memory), and how far back linear decoders name the text from a reservoir's state (recall)."""
