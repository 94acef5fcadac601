"""The model presets as objects: ``model("llama-3-70b")`` a ``Transformer`` at its pre-training
sequence length, from the published configurations of ``_specs``."""

from __future__ import annotations

from typing import Any

from ._specs import MODELS, model_key
from ._transformer import Transformer


def model(name: str, **overrides: Any) -> Transformer:
    """The ``Transformer`` preset ``name`` (case-insensitive; see ``MODELS``) at its pre-training
    sequence length; ``overrides`` set any field (``microbatch_size=2``, ``recompute="selective"``,
    ``sequence=32768``, ...)."""
    spec = MODELS[model_key(name)]
    fields = {"sequence": spec.sequence, **overrides}
    if spec.hf:
        return Transformer.from_hf_config(spec.config, **fields)
    return Transformer(**{**spec.config, **fields})
