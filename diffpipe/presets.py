"""Named devices, links, models and frameworks (``diffpipe.presets``).

``device("H100")`` gives a ``Device``, ``network("nvlink4", "ib-ndr")`` a ``Network``,
``model("llama-3-70b")`` a ``Transformer`` and ``framework("megatron")`` a ``Framework`` (what a
training framework overlaps and in what precision it reduces gradients: ``FRAMEWORKS``); the tables
``DEVICES``, ``NETWORKS`` and ``MODELS`` hold the published figures with their sources. Units:
FLOP/s, bytes, bytes/s per direction, seconds. The tables live in ``diffpipe._machine._specs`` and
``diffpipe._model._specs`` (no JAX: listing presets stays light), the constructors in
``diffpipe._machine._presets``, ``diffpipe._model._presets`` and ``diffpipe._workload._frameworks``,
loaded on first use; this module gathers them.
"""

from __future__ import annotations

import importlib as _importlib
from typing import TYPE_CHECKING, Any

from ._machine._specs import DEVICES as DEVICES
from ._machine._specs import NETWORKS as NETWORKS
from ._machine._specs import DeviceSpec as DeviceSpec
from ._machine._specs import LinkSpec as LinkSpec
from ._machine._specs import devices as devices
from ._machine._specs import networks as networks
from ._model._specs import MODELS as MODELS
from ._model._specs import ModelSpec as ModelSpec
from ._model._specs import models as models

if TYPE_CHECKING:
    from ._machine._presets import device as device
    from ._machine._presets import network as network
    from ._model._presets import model as model
    from ._workload._frameworks import FRAMEWORKS as FRAMEWORKS
    from ._workload._frameworks import framework as framework

#: The constructors, which need JAX: name -> the module that defines it, imported on first access.
_CONSTRUCTORS = {"device": "._machine._presets", "network": "._machine._presets", "model": "._model._presets",
                 "framework": "._workload._frameworks", "FRAMEWORKS": "._workload._frameworks"}


def __getattr__(name: str) -> Any:
    if name not in _CONSTRUCTORS:
        raise AttributeError(f"module 'diffpipe.presets' has no attribute {name!r}")
    value = getattr(_importlib.import_module(_CONSTRUCTORS[name], "diffpipe"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_CONSTRUCTORS})


def preset_names() -> dict[str, tuple[str, ...]]:
    """The preset names: ``{"devices": (...), "networks": (...), "models": (...)}``."""
    return {"devices": devices(), "networks": networks(), "models": models()}
