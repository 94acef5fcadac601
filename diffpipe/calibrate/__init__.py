"""Calibration from real runs: op times and per-op costs measured on a machine, as a ``Hardware``.

``from_torch_trace`` reads ``torch.profiler`` traces of ``torch.distributed.pipelining`` steps,
``profile_stages`` times torch modules the way a pipelined step runs them, ``from_measurements``
takes times you measured yourself; each returns a ``Calibration`` whose ``hardware(schedule)``
feeds ``simulate``/``compare``/``optimize``/``sweep`` and whose ``to_toml`` writes a machine file
for the CLI (``cli_calibrate`` is the ``diffpipe calibrate`` command's body). A calibration from
full-backward runs predicts split (zero-bubble, V) schedules once it has the I/W split:
``from_torch_trace(..., model=)`` (the model's FLOPs) or ``(..., probe=profile_stages(...))``
(``Calibration.with_split``); without it, its ``Hardware`` refuses I/W ops. The recipe:
``docs/calibrate.md``.
``TorchRuntime`` is the communication mode of torch's pipelining runtime over gloo (``receive_posts``:
where torch posts each receive); ``predict(..., mode="torch-runtime")`` uses it.
``combine`` joins the calibrations of several runs (other schedules or sizes), each term with its
spread across them. ``fit_kernel_efficiency`` fits a ``Device``'s kernel-efficiency curve to measured op times.
``run_ranks`` runs a script as the ranks of a local gloo group (each failing rank's exit code and
output reported); ``communication_mode`` turns the name ``"torch-runtime"`` into ``TorchRuntime()``.
"""

from ._calibration import Calibration as Calibration
from ._calibration import combine as combine
from ._calibration import communication_mode as communication_mode
from ._calibration import from_measurements as from_measurements
from ._cli import cli_calibrate as cli_calibrate
from ._efficiency import fit_kernel_efficiency as fit_kernel_efficiency
from ._measure import profile_stages as profile_stages
from ._ranks import run_ranks as run_ranks
from ._runtime import TorchRuntime as TorchRuntime
from ._runtime import receive_posts as receive_posts
from ._trace import from_torch_trace as from_torch_trace
from ._trace import traced_schedule as traced_schedule

__all__ = ["Calibration", "TorchRuntime", "cli_calibrate", "combine", "communication_mode", "fit_kernel_efficiency",
           "from_measurements", "from_torch_trace", "profile_stages", "receive_posts", "run_ranks", "traced_schedule"]
