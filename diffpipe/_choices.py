"""The closed lists of values the library accepts, one home each, without JAX (the CLI offers them
as choices before it loads the library)."""

from __future__ import annotations

#: ``Transformer.recompute``: activation recomputation ``"none"``, ``"selective"`` (the attention
#: core, Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
#: MLSys 2023) or ``"full"`` (every layer from its input).
RECOMPUTE = ("none", "selective", "full")
#: ``Parallelism.zero``: the ZeRO stages (Rajbhandari et al., "ZeRO: Memory Optimizations Toward
#: Training Trillion Parameter Models", SC'20): 0 none, 1 optimizer states, 2 and gradients, 3 and
#: parameters sharded over data parallelism.
ZERO_STAGES = (0, 1, 2, 3)
#: The built-in communication modes by name (``_engine._communication.MODES`` maps each to its
#: class; a test checks they agree).
COMMUNICATION_MODES = ("none", "overlap", "contention", "blocking", "rendezvous")
#: The training-framework presets by name (``_workload._frameworks.FRAMEWORKS`` maps each to its
#: ``Framework``; a test checks they agree).
FRAMEWORK_NAMES = ("none", "megatron", "torchtitan", "fsdp", "ddp")
#: ``calibrate.TorchRuntime``'s name: the mode of torch's pipelining runtime over gloo, a mode of
#: ``diffpipe.calibrate`` rather than a built-in one (``calibrate.communication_mode`` maps the name to it).
TORCH_RUNTIME = "torch-runtime"
#: The modes a machine (``--mode``, a machine file's ``[network] mode``) may name: the built-in ones and
#: ``TORCH_RUNTIME`` (which ``diffpipe calibrate`` may write).
MACHINE_MODES = (*COMMUNICATION_MODES, TORCH_RUNTIME)
