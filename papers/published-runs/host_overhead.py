"""Could the host (CPU) side make llm-foundry's short-sequence H100 rows slower than diffpipe predicts? A diagnosis
on the TEST rows (issue 22), not a fit: nothing computed here enters diffpipe.

The hypothesis: PyTorch eager launches every op from Python (the dispatcher, autocast's casts, autograd), CUDA
kernels are launched asynchronously, so the host runs ahead of the GPU as long as it issues a layer's kernels faster
than the GPU runs them; where it does not (short kernels: small microbatches, a fast GPU), the GPU idles and a layer
takes ``max(GPU time, host time)``. This script puts numbers on both sides, per transformer block and microbatch:

- the GPU side: ``Configuration.compute_seconds()`` of one block (its ``F + I + W`` kernels) of every llm-foundry row
  of ``test_runs.rows()``, as the model prices it;
- the host side, two ways. (a) **Measured on this machine's CPU** (a labelled local measurement, not an H100 host's
  number): an MPT block as llm-foundry 5e85bd62d writes it (``llmfoundry/models/layers/blocks.py``,
  ``attention.py``, ``ffn.py``, ``norm.py``: LayerNorm in low precision, the fused ``Wqkv`` split into q, k, v, the
  Triton flash-attention autograd function, GeLU MLP, two residual adds), fp32 weights under bf16 autocast (Composer's
  ``amp_bf16`` with FSDP's ``DEFAULT`` mixed precision keeps fp32 parameters), at tiny shapes so that the kernels cost
  nothing next to the dispatch: its forward and backward wall time on one CPU thread, and its ATen ops counted by a
  ``TorchDispatchMode`` (every op the dispatcher runs, views and autocast's casts included). The attention kernel is
  a stand-in autograd function with the Triton function's allocations and launches (``flash_attn_triton.py``:
  forward ``o``, ``lse`` and ``tmp`` allocated and one kernel; backward ``dq`` zeroed in fp32, ``dk``, ``dv`` and a
  preprocessed ``do`` allocated, two kernels, ``dq`` copied back), each launch priced as one cheap ATen op.
  (b) **Published per-op host costs**, ATen ops x cost: "Overhead for torch functions when run on torch.Tensor
  objects is on the order of 2 us" (PyTorch's own ``benchmarks/overrides_benchmark/README.md``), "4 us per op on
  CUDA" (pytorch/pytorch issue #82793, an A100 model the profiler's maintainer called "completely dispatch bound"),
  8 us a submitted ``add`` on an A100 host, vendor CUDA path (flagos-ai/Torch-FL pull request #27, "submit": ops
  issued back to back, one sync at the end, so the host's cost alone).
- FSDP's per-unit hooks (pre-forward all-gather, post-backward reduce-scatter with its cast and pre-divide) and the
  optimizer's loop are per unit and per step, not per kernel; they are not measured here (no process group on a CPU
  build worth timing against an H100 host), and are bounded in ``host_overhead.md`` by the same per-op costs.

For every row it reports the host time per block at each cost, its ratio to the GPU time (above 1: host-bound), and
the **break-even** host cost per ATen op: the cost at which ``max(GPU, host)`` would give the row's published
throughput, if every block were host-bound by the same factor (``GPU block x (1 + error) / ops``; only for rows
predicted too fast).

    python papers/published-runs/host_overhead.py             # writes host_overhead.json / host_overhead.md
    python papers/published-runs/host_overhead.py --no-write  # print only
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import test_runs

HERE = Path(__file__).resolve().parent
#: Published host costs of one eager op (seconds), each with its source (module docstring).
PUBLISHED_COST = {
    "pytorch overrides_benchmark README (~2 us)": 2e-6,
    "pytorch/pytorch#82793 (4 us per op on CUDA)": 4e-6,
    "flagos-ai/Torch-FL#27 (8 us, A100 host, submit)": 8e-6,
}


def _torch():
    import torch

    return torch


def mpt_block(hidden: int, heads: int, expansion: int = 4):
    """An MPT block as llm-foundry 5e85bd62d writes it (module docstring), on the CPU, fp32 weights, no biases."""
    torch = _torch()
    F = torch.nn.functional

    def autocast_dtype(x):  # llmfoundry/models/layers/norm.py: _cast_if_autocast_enabled
        if torch.is_autocast_enabled(x.device.type):
            return x.to(dtype=torch.get_autocast_dtype(x.device.type))
        return x

    class LPLayerNorm(torch.nn.LayerNorm):
        def forward(self, x):
            x_, w_ = autocast_dtype(x), autocast_dtype(self.weight)
            with torch.autocast(device_type=x.device.type, enabled=False):
                return F.layer_norm(x_, self.normalized_shape, w_, None, self.eps)

    class TritonAttention(torch.autograd.Function):
        """The allocations and launches of ``flash_attn_triton.py``'s function, a launch priced as one cheap op."""

        @staticmethod
        def forward(ctx, q, k, v):
            b, s, h, d = q.shape
            o = torch.empty_like(q)
            lse = torch.empty((b, h, s), device=q.device, dtype=torch.float32)
            tmp = torch.empty((b, h, s), device=q.device, dtype=torch.float32)
            o.copy_(v)  # the forward kernel
            ctx.save_for_backward(q, k, v, o, lse)
            del tmp
            return o

        @staticmethod
        def backward(ctx, do):
            q, k, v, o, lse = ctx.saved_tensors
            do = do.contiguous()
            dq = torch.zeros_like(q, dtype=torch.float32)
            dk, dv = torch.empty_like(k), torch.empty_like(v)
            delta = torch.empty_like(lse)
            delta.zero_()  # the backward preprocess kernel
            dv.copy_(do)  # the backward kernel (writes dq, dk, dv)
            dk.copy_(do)
            return dq.to(q.dtype), dk, dv

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm_1, self.norm_2 = LPLayerNorm(hidden, bias=False), LPLayerNorm(hidden, bias=False)
            self.Wqkv = torch.nn.Linear(hidden, 3 * hidden, bias=False)
            self.out_proj = torch.nn.Linear(hidden, hidden, bias=False)
            self.up_proj = torch.nn.Linear(hidden, expansion * hidden, bias=False)
            self.down_proj = torch.nn.Linear(expansion * hidden, hidden, bias=False)
            self.act = torch.nn.GELU(approximate="none")

        def forward(self, x):
            b, s, _ = x.shape
            a = self.norm_1(x)
            qkv = self.Wqkv(a)
            q, k, v = qkv.split([hidden, hidden, hidden], dim=2)
            q, k, v = (t.reshape(b, s, heads, hidden // heads) for t in (q, k, v))  # rearrange 'b s (h d)'
            context = TritonAttention.apply(q, k, v).reshape(b, s, hidden)
            x = x + self.out_proj(context)
            n = self.down_proj(self.act(self.up_proj(self.norm_2(x))))
            return x + n

    return Block()


def count_ops(hidden: int = 64, heads: int = 4, tokens: int = 16) -> dict[str, int]:
    """ATen ops the dispatcher runs in one MPT block's forward and backward (``TorchDispatchMode``), bf16 autocast."""
    torch = _torch()
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += 1
            return func(*args, **(kwargs or {}))

    block = mpt_block(hidden, heads)
    x = torch.randn(1, tokens, hidden, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with Count() as fwd:
            y = block(x)
    with Count() as bwd:
        y.float().sum().backward()
    return dict(forward=fwd.n, backward=bwd.n)


def _fsdp_stack(blocks: list) -> Any:
    """``blocks`` each one FSDP1 unit (fp32 parameters and reduction, Composer's ``DEFAULT``), in one root unit, on a
    gloo group of one process: FSDP then runs ``NO_SHARD`` (it says so), i.e. its pre-forward and post-backward hooks
    and one all-reduce per unit, not ``FULL_SHARD``'s all-gather; None where no process group can be made."""
    torch = _torch()
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision, ShardingStrategy

    try:
        if not dist.is_initialized():
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29731")
            dist.init_process_group("gloo", rank=0, world_size=1)
    except (RuntimeError, ValueError):
        return None
    import warnings

    fp32 = MixedPrecision(param_dtype=torch.float32, reduce_dtype=torch.float32, buffer_dtype=torch.float32)
    cpu = torch.device("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "FSDP is switching to use NO_SHARD ... since the world size is 1"
        units = [FullyShardedDataParallel(b, sharding_strategy=ShardingStrategy.FULL_SHARD, device_id=cpu,
                                          mixed_precision=fp32) for b in blocks]
        return FullyShardedDataParallel(torch.nn.Sequential(*units), device_id=cpu)


def time_block(hidden: int = 64, heads: int = 4, tokens: int = 16, blocks: int = 8, repeats: int = 30,
               inner: int = 10) -> dict[str, Any]:
    """Host seconds of one MPT block's forward and of its backward at tiny shapes, one thread: the median over
    ``repeats`` of ``inner`` forward + backward passes through ``blocks`` blocks. On a CPU build the kernels run
    inline (the tiny bf16 matmuls cost tens of us each here), so this is an upper bound on the block's dispatch on
    this CPU; ``floor`` is the dispatcher's cheapest op here (a 16 x 64 ``add``), a lower bound per op; ``fsdp`` the
    same blocks each an FSDP1 unit (``_fsdp_stack``), forward + backward, the rounds alternated with the plain ones."""
    torch = _torch()
    torch.set_num_threads(1)
    plain = torch.nn.Sequential(*[mpt_block(hidden, heads) for _ in range(blocks)])
    wrapped = _fsdp_stack([mpt_block(hidden, heads) for _ in range(blocks)])
    x = torch.randn(1, tokens, hidden, requires_grad=True)
    fwd, bwd, floor, fsdp = [], [], [], []
    small = torch.randn(16, 64)
    for i in range(repeats + 3):
        f = b = 0.0
        for _ in range(inner):
            t0 = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = plain(x)
            t1 = time.perf_counter()
            y.float().sum().backward()
            t2 = time.perf_counter()
            f, b = f + t1 - t0, b + t2 - t1
        t0 = time.perf_counter()
        for _ in range(1000):
            small.add(small)
        t1 = time.perf_counter()
        if wrapped is not None:
            for _ in range(inner):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    y = wrapped(x)
                y.float().sum().backward()
        t2 = time.perf_counter()
        if i >= 3:  # warm-up
            fwd.append(f / inner / blocks)
            bwd.append(b / inner / blocks)
            floor.append((t1 - t0) / 1000)
            fsdp.append((t2 - t1) / inner / blocks)
    out = dict(forward=statistics.median(fwd), backward=statistics.median(bwd), floor=statistics.median(floor),
               forward_range=[min(fwd), max(fwd)], backward_range=[min(bwd), max(bwd)],
               floor_range=[min(floor), max(floor)],
               hidden=hidden, heads=heads, tokens=tokens, blocks=blocks, repeats=repeats, inner=inner)
    if wrapped is not None:
        out |= dict(fsdp=statistics.median(fsdp), fsdp_range=[min(fsdp), max(fsdp)])
    return out


def gpu_block_seconds(cfg: Any) -> float:
    """The model's GPU seconds of one transformer block's ``F + I + W`` for one microbatch (the first block's row)."""
    compute = cfg.compute_seconds()
    return float(sum(np.asarray(v, np.float64)[:, 1].sum() for v in compute.values()))


def break_even(gpu_block: float, error: float, ops: float) -> float | None:
    """Host seconds per ATen op at which a host-bound block (``max(GPU, host)``) would be ``1 + error`` times the
    GPU block, i.e. give a row predicted ``error`` too fast its published throughput; None if the row is not too
    fast."""
    if error <= 0:
        return None
    return gpu_block * (1 + error) / ops


def test_runs_rows() -> list:
    """The TEST rows, ``test_runs.rows()``."""
    return test_runs.rows()


def rows_table(ops: dict[str, int], host_measured: float, floor: float,
               fsdp: float | None = None) -> list[dict[str, Any]]:
    """Every llm-foundry TEST row: its model GPU block time, the host's at each cost (``host_measured`` seconds for
    the ``ops`` of a block's forward and backward; full recomputation runs the forward's again), and the break-even
    cost."""
    committed = {r["name"]: r for r in json.loads((HERE / "test_results.json").read_text())["rows"]}
    out = []
    for row in test_runs_rows():
        if row.study != "llm_foundry":
            continue
        cfg = row.build()
        gpu = gpu_block_seconds(cfg)
        model_, cluster, r, zero = row.build.__defaults__
        no_loop = dataclasses.replace(cfg.framework, optimizer_ops=0)
        bare = test_runs.configuration(model_, cluster, r["gpus"], r["batch"], zero=zero, framework=no_loop)
        update, update_gpu = (float(np.sum(np.asarray(c.update_seconds()))) for c in (cfg, bare))
        error = committed[row.name]["error"]
        _, model, seq, mbs, recompute = row.series.split(":")
        base = ops["forward"] + ops["backward"]
        row_ops = base + (ops["forward"] if recompute == "full" else 0)
        out.append(dict(name=row.name, device=row.device, sequence=int(seq), microbatch=int(mbs), recompute=recompute,
                        gpus=row.gpus, error=error, gpu_block=gpu, ops=row_ops,
                        host_measured=host_measured * row_ops / base,
                        ratio_measured=host_measured * row_ops / base / gpu,
                        ratio_floor=floor * row_ops / gpu,
                        ratio_fsdp=None if fsdp is None else fsdp * row_ops / base / gpu,
                        ratio_published={k: c * row_ops / gpu for k, c in PUBLISHED_COST.items()},
                        break_even=break_even(gpu, error, row_ops), update=update, update_gpu=update_gpu,
                        step=float(cfg.evaluate().step_time)))
    return out


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def markdown(result: dict[str, Any]) -> str:
    m, c, rows = result["measured"], result["ops"], result["rows"]
    us = 1e6
    fsdp = m.get("fsdp")
    key = "ratio_fsdp" if fsdp is not None else "ratio_measured"
    worst = max(rows, key=lambda r: r[key])
    short = [r for r in rows if r["device"] == "H100" and r["sequence"] <= 2048 and r["error"] > 0]
    block = m["forward"] + m["backward"]
    lines = [
        "# Host (CPU) dispatch against the GPU, per transformer block and microbatch (issue 22; a diagnosis)", "",
        "Generated by `python papers/published-runs/host_overhead.py` (method and sources: its docstring). "
        "Nothing here enters diffpipe; the TEST rows are not fitted to.", "",
        f"- ATen ops of one MPT block (bf16 autocast, fp32 weights): forward {c['forward']}, backward "
        f"{c['backward']} (full recomputation adds the forward's {c['forward']} again). The model's own kernel list "
        "has 28 kernels a block (10 F, 13 I, 5 W).",
        f"- Measured on this machine ({result['machine']}, one thread, load {result['load']} when it ran), "
        f"medians of {m['repeats']} rounds: {us * m['forward']:.0f} us forward + {us * m['backward']:.0f} us "
        f"backward a block at tiny shapes (ranges {us * m['forward_range'][0]:.0f}-{us * m['forward_range'][1]:.0f}"
        f" / {us * m['backward_range'][0]:.0f}-{us * m['backward_range'][1]:.0f} us), "
        f"{us * block / (c['forward'] + c['backward']):.1f} us per ATen op: an upper bound (the CPU build runs its "
        "tiny bf16 kernels inline: `aten::mm` alone ~30 us a call); the dispatcher's cheapest op (a 16 x 64 `add`) "
        f"{us * m['floor']:.2f} us ({us * m['floor_range'][0]:.2f}-{us * m['floor_range'][1]:.2f}), a lower bound."
        + ("" if fsdp is None else
           f" Each block an FSDP1 unit (NO_SHARD on a gloo group of one: its hooks and a per-unit all-reduce): "
           f"{us * fsdp:.0f} us a block forward + backward ({us * m['fsdp_range'][0]:.0f}-"
           f"{us * m['fsdp_range'][1]:.0f}), {us * (fsdp - block):.0f} us more than the plain block.")
        + " Labelled local measurements: not an H100 host's numbers.",
        "- Published per-op costs: " + "; ".join(PUBLISHED_COST) + ".", "",
        f"Largest host/GPU ratio of the {len(rows)} llm-foundry rows at the measured "
        f"{'FSDP ' if fsdp is not None else ''}block: {worst[key]:.3f} ({worst['name']}, GPU "
        f"{1e3 * worst['gpu_block']:.2f} ms a block); at the largest published cost (8 us an op): "
        f"{max(max(r['ratio_published'].values()) for r in rows):.3f}. No row is host-bound: `max(GPU, host)` is "
        "the GPU's time in every row, so a host term of that form (the host's lead is lost only where it issues a "
        "block slower than the GPU runs it) moves no TEST prediction at any of these costs.", "",
        f"The H100 rows of <= 2,048 tokens predicted too fast ({len(short)}): the host cost per ATen op that would "
        "make each one's published throughput if every block were host-bound alike (break-even), against the "
        "measured and published ones:", "",
        "| row | mbs:recompute | error | GPU block (ms) | host/GPU: measured | FSDP measured | floor | at 8 us | "
        "break-even per op (us) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(short, key=lambda r: r["name"]):
        f = "-" if r["ratio_fsdp"] is None else f"{r['ratio_fsdp']:.3f}"
        lines.append(f"| {r['name']} | {r['microbatch']}:{r['recompute']} | {100 * r['error']:+.1f}% | "
                     f"{1e3 * r['gpu_block']:.2f} | {r['ratio_measured']:.3f} | {f} | {r['ratio_floor']:.4f} | "
                     f"{max(r['ratio_published'].values()):.3f} | {us * r['break_even']:.0f} |")
    lines += ["", "The optimizer step (`Framework.optimizer_ops`: Composer's `DecoupledAdamW` loops over the "
              "parameter tensors with a `.item()` host sync in each, so neither side runs ahead; the `fsdp` preset, "
              "10 ops a tensor at 4 us): per step, the model's update with the loop against its traffic alone, and "
              "that difference's share of the row's predicted step (the preset's step):", "",
              "| row | update, loop (ms) | traffic alone (ms) | share of the step |", "|---|---:|---:|---:|"]
    for r in sorted(short, key=lambda r: r["name"]):
        lines.append(f"| {r['name']} | {1e3 * r['update']:.2f} | {1e3 * r['update_gpu']:.2f} | "
                     f"{(r['update'] - r['update_gpu']) / r['step']:.2%} |")
    a100 = [r for r in rows if r["device"] == "A100" and r["sequence"] <= 2048]
    h100 = [r for r in rows if r["device"] == "H100" and r["sequence"] <= 2048]
    lines += ["", "GPU block time per microbatch at <= 2,048 tokens (the model's): H100 "
              f"{1e3 * min(r['gpu_block'] for r in h100):.2f}-{1e3 * max(r['gpu_block'] for r in h100):.1f} ms, "
              f"A100 {1e3 * min(r['gpu_block'] for r in a100):.2f}-{1e3 * max(r['gpu_block'] for r in a100):.1f} ms."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args(argv)
    ops = count_ops()
    measured = time_block()
    rows = rows_table(ops, measured["forward"] + measured["backward"], measured["floor"], measured.get("fsdp"))
    result = dict(machine=f"{_cpu_name()}, torch {_torch().__version__}",
                  load=f"{os.getloadavg()[0]:.1f}", ops=ops, measured=measured, published_cost=PUBLISHED_COST,
                  rows=rows)
    text = markdown(result)
    print(text)
    if args.no_write:
        return
    import diffpipe as dp

    for suffix, body in (("json", json.dumps(result, indent=1) + "\n"), ("md", text)):
        dp.write_atomic(HERE / f"host_overhead.{suffix}", body)


if __name__ == "__main__":
    main()
