"""Named devices, links and models, as published by their vendors (``diffpipe.presets``).

``device("H100")`` gives a ``Device``, ``network("nvlink4", "ib-ndr")`` a ``Network`` and
``model("llama-3-70b")`` a ``Transformer``; the tables ``DEVICES``, ``NETWORKS`` and ``MODELS``
hold the published figures with their sources. Units: FLOP/s, bytes, bytes/s per direction,
seconds. The devices and links live in ``diffpipe._machine._presets``, the models in
``diffpipe._model._presets``; this module gathers them.
"""

from ._machine._presets import DEVICES as DEVICES
from ._machine._presets import NETWORKS as NETWORKS
from ._machine._presets import DeviceSpec as DeviceSpec
from ._machine._presets import LinkSpec as LinkSpec
from ._machine._presets import device as device
from ._machine._presets import devices as devices
from ._machine._presets import network as network
from ._machine._presets import networks as networks
from ._model._presets import MODELS as MODELS
from ._model._presets import ModelSpec as ModelSpec
from ._model._presets import model as model
from ._model._presets import models as models


def preset_names() -> dict[str, tuple[str, ...]]:
    """The preset names: ``{"devices": (...), "networks": (...), "models": (...)}``."""
    return {"devices": devices(), "networks": networks(), "models": models()}
