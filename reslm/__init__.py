"""reslm: reservoir-computing language models (Köster & Uchida, "Reservoir Computing as a Language Model").

The package follows the pipeline: data (corpus -> tokens) -> reservoir (tokens -> fixed states)
-> models (states/tokens -> logits) -> train -> generate / evaluate -> bench.
"""
__version__ = "0.1.0"
