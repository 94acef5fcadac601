"""Time torch modules the way a pipelined step runs them: ``profile_stages``."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from .._errors import ConfigError
from ._calibration import Calibration, robust_mean, robust_spread


def profile_stages(stages: Sequence[Any], example_inputs: Any, *, repeats: int = 9, warmup: int = 3,
                   loss_fn: Callable[[Any], Any] | None = None, overhead: float = 0.0, p2p: float = 0.0,
                   clock: Callable[[], float] = time.perf_counter) -> Calibration:
    """Mean forward, full backward, input-gradient and weight-gradient times of torch ``stages``.

    Stage ``s`` runs on the (detached) output of stage ``s - 1``; stage 0 on ``example_inputs`` (a
    tensor or a tuple of tensors). The conditions are a pipelined step's: every backward
    accumulates into the parameters' existing ``.grad`` (never reset, so no gradient buffer is
    allocated in the timed region), the allocator is warm (``warmup`` untimed rounds first), and the
    split backward is torch's own (``torch.distributed.pipelining._backward.stage_backward_input``
    and ``stage_backward_weight``; on stage 0, as in torch, ``I`` is empty and ``W`` runs the full
    backward). The last stage backpropagates ``loss_fn(output)`` when given,
    otherwise a fixed random output gradient, like every other stage. ``overhead`` and ``p2p`` (the
    framework cost per op and per transfer, which only a run of the schedule shows: see
    ``from_torch_trace``) are passed through. Returns a ``Calibration`` (``robust_mean`` of ``repeats``).
    """
    import torch
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    if not stages:
        raise ConfigError("profile_stages: no stages given")
    if not isinstance(repeats, int) or repeats < 1 or not isinstance(warmup, int) or warmup < 0:
        raise ConfigError(f"profile_stages: repeats must be >= 1 and warmup >= 0, got {repeats!r}, {warmup!r}")
    inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    forward, backward, input_grad, weight = [], [], [], []
    spread: dict[str, float | None] = {}
    generator = torch.Generator().manual_seed(0)
    for s, module in enumerate(stages):
        params = [p for p in module.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        xs = tuple(x.detach().requires_grad_(s > 0 and x.is_floating_point()) for x in inputs)
        last = s == len(stages) - 1

        def run(_module=module, _xs=xs):
            out = _module(*_xs)
            return out if isinstance(out, tuple) else (out,)

        with torch.no_grad():
            shape_out = run()
        grads = [torch.randn(o.shape, generator=generator, dtype=o.dtype) for o in shape_out]

        def target(outs, _grads=grads, _last=last):
            if _last and loss_fn is not None:
                return [loss_fn(*outs)], None
            return list(outs), list(_grads)

        times: dict[str, list[float]] = {"F": [], "B": [], "I": [], "W": []}
        for k in range(warmup + repeats):
            t0 = clock()
            outs = run()
            t1 = clock()
            roots, out_grads = target(outs)
            torch.autograd.backward(roots, grad_tensors=out_grads)
            t2 = clock()
            outs = run()
            roots, out_grads = target(outs)
            t3 = clock()
            if s == 0:  # torch's convention: stage 0 has no input gradient; its W is the full backward
                t3 = t4 = clock()
                torch.autograd.backward(roots, grad_tensors=out_grads)
            else:
                _, groups = stage_backward_input(roots, out_grads, [x for x in xs if x.requires_grad], iter(params))
                t4 = clock()
                stage_backward_weight(iter(params), groups)
            t5 = clock()
            if k >= warmup:
                for kind, dt in (("F", t1 - t0), ("B", t2 - t1), ("I", t4 - t3), ("W", t5 - t4)):
                    times[kind].append(dt)
        forward.append(robust_mean(times["F"]))
        backward.append(robust_mean(times["B"]))
        input_grad.append(robust_mean(times["I"]))
        weight.append(robust_mean(times["W"]))
        spread.update({f"{kind}{s}": robust_spread(times[kind]) for kind in "FBIW"})
        with torch.no_grad():
            inputs = run()
    return Calibration(tuple(forward), tuple(backward), tuple(input_grad), tuple(weight), overhead=overhead,
                       p2p=p2p, samples={f"{kind}{s}": repeats for kind in "FBIW" for s in range(len(stages))},
                       spread=spread, source="profile_stages")
