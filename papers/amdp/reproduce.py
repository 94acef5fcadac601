"""Reproduce the AMDP comparison in diffpipe's model: throughput, bubble, memory and staleness.

AMDP (Chen, Wu and Yu, "AMDP: Asynchronous Multi-Directional Pipeline Parallelism for Large-Scale
Models Training", ICML 2026, arXiv:2605.29664; code: github.com/Vinsmoke86/AMDP) against GPipe,
1F1B, interleaved 1F1B, PipeDream and PipeDream-2BW, on the GPT configuration of the authors'
8-GPU scripts (``examples/pretrain_gpt_distributed_fd_async.sh``: pipeline size 8, 48 layers,
hidden 1600, 25 heads, sequence 1024, microbatch 4, global batch 32, fp16) on one modelled
NVLink node of A100s.

Usage::

    python papers/amdp/reproduce.py           # every table and the figure (a few minutes on 2 cores)
    python papers/amdp/reproduce.py --fast    # the authors' configuration only, shorter windows

Writes ``results.json``, ``throughput.md``, ``memory.md``, ``staleness.md`` and ``amdp.png`` next
to this file (or into ``--out``). The README explains every column; ``tests/test_paper_amdp.py``
turns each claim into a test through the functions below.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

import diffpipe as dp
from diffpipe.schedules import Schedule, get, staleness, weight_versions

HERE = Path(__file__).resolve().parent

#: The GPT of the authors' scripts. V: GPT-2's 50257 tokens padded by Megatron to a multiple of 128.
GPT = dict(layers=48, hidden=1600, heads=25, sequence=1024, vocabulary=50304, microbatch_size=4, dtype_bytes=2)
DEVICES = 8
#: Global batch 32 / microbatch 4 (the authors' scripts): one AMDP round per optimizer step.
MICROBATCHES = 8
#: A larger global batch (128 samples, four rounds per step), which favours synchronous schedules.
MICROBATCHES_LARGE = 32
DEVICE, LINK = "A100", "nvlink3"
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "pipedream", "pipedream-2bw", "amdp")
ASYNCHRONOUS = ("pipedream", "pipedream-2bw", "amdp")

#: Mixed-precision Adam bytes per parameter (Rajbhandari et al., ZeRO, SC'20, §3.1): fp16 weights,
#: fp16 gradients, and fp32 master weights, momentum and variance (the optimizer state).
WEIGHT_BYTES, GRADIENT_BYTES, OPTIMIZER_BYTES = 2, 2, 12
GB = 1e9


def schedule(name: str, microbatches: int = MICROBATCHES, *, fast: bool = False) -> Schedule:
    """The schedule of ``name`` on 8 devices; asynchronous ones unroll a window long enough to show
    a steady state (steps of ``microbatches``; PipeDream: one microbatch per step)."""
    steps = 4 if fast else 8
    if name == "interleaved-1f1b":
        return get(name, devices=DEVICES, microbatches=microbatches, chunks=2)
    if name == "pipedream":
        return get(name, devices=DEVICES, microbatches=(3 if fast else 8) * DEVICES)
    if name in ("pipedream-2bw", "amdp"):
        return get(name, devices=DEVICES, microbatches=microbatches, steps=steps)
    return get(name, devices=DEVICES, microbatches=microbatches)


def model() -> dp.Transformer:
    return dp.Transformer(**GPT)


def hardware(s: Schedule, *, device: str = DEVICE, link: str = LINK, balanced: bool = False) -> dp.Hardware:
    """``hardware_from_model`` for the GPT split into ``s.stages`` stages of consecutive layers
    (Megatron's uniform split: the LM head makes the last stage heavier). ``balanced`` replaces the
    per-stage times by their mean (same total work, no imbalance): the schedule effect alone."""
    import equinox as eqx
    import jax.numpy as jnp

    hw = dp.hardware_from_model(model(), dp.presets.device(device), dp.presets.network(link), stages=s.stages)
    if balanced:
        hw = eqx.tree_at(
            lambda h: (h.forward, h.input_grad, h.weight),
            hw,
            tuple(jnp.full_like(x, jnp.mean(x)) for x in (hw.forward, hw.input_grad, hw.weight)),
        )
    return hw


def throughput(s: Schedule, hw: dp.Hardware) -> dict:
    """Steady-state time per optimizer step, samples/s and bubble.

    Synchronous schedules: one step is the makespan. Asynchronous ones: the step period from
    ``Result.period`` (differences of consecutive step finishes), the median of the interior gaps
    (the first and last are warm-up and drain); the bubble is then ``1 - work per step / (D x
    period)``, work per step being the window's busy time over its steps.
    """
    result = dp.simulate(s, hw)
    per_step = s.microbatches_per_step
    if s.asynchronous:
        gaps = np.asarray(result.period, dtype=float)
        interior = gaps[1:-1] if gaps.size > 2 else gaps
        period = float(np.median(interior))
        work = float(np.sum(np.asarray(result.busy))) / s.steps
        bubble = 1.0 - work / (s.devices * period)
        spread = float(np.ptp(interior) / period)
    else:
        period = float(result.makespan)
        bubble = float(result.bubble_ratio)
        spread = 0.0
    samples = per_step * GPT["microbatch_size"]
    return {
        "step_s": period,
        "microbatches_per_step": per_step,
        "samples_per_s": samples / period,
        "bubble": bubble,
        "window_bubble": float(result.bubble_ratio),
        "period_spread": spread,
    }


def memory(s: Schedule, hw: dp.Hardware) -> dict:
    """Per device: replicas held, weight versions, static bytes and peak activation bytes.

    Static bytes per parameter of a held (pipeline, stage): fp16 weights x versions (weight
    stashing keeps one copy per version), fp16 gradients, and the fp32 optimizer state only where
    the device owns the stage. AMDP shards the optimizer state (ZeRO-1 over the replicas, as in the
    authors' ``--zero1-bidirectional-pipeline``): device d owns stage d, the one pipeline 0 places
    there; the unsharded figure gives every replica its state. Activations: ``Result.peak_memory``
    with the static bytes zeroed (exact, from the device orders).
    """
    import equinox as eqx
    import jax.numpy as jnp

    params = np.asarray(hw.gradient_bytes, dtype=float) / GPT["dtype_bytes"]  # per stage
    versions = weight_versions(s)
    placement = s.placement
    static, unsharded, replicas, held_versions = [], [], [], []
    for d in range(s.devices):
        held = placement.held(d)
        total = full = 0.0
        for p, st in held:
            n = params[st]
            copies = WEIGHT_BYTES * versions[p][st] + GRADIENT_BYTES
            owner = placement.device(0, st) == d
            total += n * (copies + (OPTIMIZER_BYTES if owner else 0))
            full += n * (copies + OPTIMIZER_BYTES)
        static.append(total)
        unsharded.append(full)
        replicas.append(len({p for p, _ in held}))
        held_versions.append(max(versions[p][st] for p, st in held))
    bare = eqx.tree_at(lambda h: h.static_bytes, hw, jnp.zeros_like(hw.static_bytes))
    result = dp.simulate(s, bare)
    activations = np.asarray(result.peak_memory, dtype=float)
    return {
        "replicas": replicas,
        "weight_versions": held_versions,
        "static_bytes": static,
        "static_unsharded_bytes": unsharded,
        "activation_bytes": activations.tolist(),
        "peak_activations": np.asarray(result.peak_activations).astype(int).tolist(),
        "total_bytes": (np.asarray(static) + activations).tolist(),
        "capacity_bytes": float(np.asarray(hw.capacity)),
    }


def first_stage_in_flight(s: Schedule) -> int:
    """The most microbatches any pipeline's first stage holds between forward and backward."""
    most = 0
    for order in s.orders:
        held: dict[int, int] = {}
        for op in order:
            if op.stage != 0 or op.kind not in ("F", "B", "I"):
                continue
            held[op.pipeline] = held.get(op.pipeline, 0) + (1 if op.kind == "F" else -1)
            most = max(most, held[op.pipeline])
    return most


def staleness_summary(s: Schedule) -> dict:
    """Optimizer updates between each microbatch's forward and backward (``staleness``, the most
    over its stages), over the interior steps of the window (the first and last are warm-up and
    drain). A microbatch is *mismatched* when its backward runs on weights updated since its
    forward on some stage: an update falls in between and the family does not stash weights;
    the pairs fraction counts (stage, microbatch) pairs instead. ``first_stage_in_flight``: the
    most microbatches a pipeline's first stage holds between forward and backward at once."""
    per_step = s.microbatches_per_step
    worst: dict[int, int] = {}
    for op, updates in staleness(s).items():
        worst[op.microbatch] = max(worst.get(op.microbatch, 0), updates)
    steps = range(1, s.steps - 1) if s.steps > 2 else range(s.steps)
    chosen = [m for m in worst if m // per_step in steps]
    stale = [m for m in chosen if worst[m] > 0]
    pairs = [updates for op, updates in staleness(s).items() if op.microbatch // per_step in steps]
    per_step_counts = [sum(1 for m in stale if m // per_step == t) for t in steps]
    return {
        "max_updates_between_f_and_b": max((worst[m] for m in chosen), default=0),
        "stale_fraction": len(stale) / len(chosen) if chosen else 0.0,
        "stale_per_step": max(per_step_counts, default=0),
        "stashing": s.stashing,
        "mismatched_fraction": 0.0 if s.stashing else (len(stale) / len(chosen) if chosen else 0.0),
        "mismatched_pairs_fraction": 0.0 if s.stashing else sum(u > 0 for u in pairs) / max(len(pairs), 1),
        "first_stage_in_flight": first_stage_in_flight(s),
    }


def evaluate(
    name: str, microbatches: int = MICROBATCHES, *, fast: bool = False, device: str = DEVICE, link: str = LINK
) -> dict:
    """Every number of one schedule: throughput on the authors' split and balanced, memory, staleness."""
    s = schedule(name, microbatches, fast=fast)
    hw = hardware(s, device=device, link=link)
    return {
        "schedule": name,
        "microbatches": microbatches,
        "device": device,
        "throughput": throughput(s, hw),
        "balanced": throughput(s, hardware(s, device=device, link=link, balanced=True)),
        "memory": memory(s, hw),
        "staleness": staleness_summary(s),
    }


# -- outputs ---------------------------------------------------------------------------------------


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def throughput_table(runs: list[dict]) -> str:
    amdp = {r["microbatches"]: r for r in runs if r["schedule"] == "amdp"}
    rows = []
    for r in runs:
        t, b = r["throughput"], r["balanced"]
        ref = amdp[r["microbatches"]]
        rows.append(
            [
                r["schedule"],
                str(r["microbatches"]),
                str(t["microbatches_per_step"]),
                f"{t['step_s'] * 1e3:.1f}",
                f"{t['samples_per_s']:.1f}",
                f"{t['samples_per_s'] / ref['throughput']['samples_per_s']:.2f}",
                f"{t['bubble']:.3f}",
                f"{b['samples_per_s']:.1f}",
                f"{b['samples_per_s'] / ref['balanced']['samples_per_s']:.2f}",
                f"{b['bubble']:.3f}",
            ]
        )
    header = [
        "schedule",
        "N",
        "microbatches per step",
        "step time (ms)",
        "samples/s",
        "vs AMDP",
        "bubble",
        "balanced: samples/s",
        "balanced: vs AMDP",
        "balanced: bubble",
    ]
    return _table(header, rows)


def memory_table(runs: list[dict]) -> str:
    rows = []
    for r in runs:
        m = r["memory"]
        worst = int(np.argmax(m["total_bytes"]))
        rows.append(
            [
                r["schedule"],
                str(r["microbatches"]),
                str(max(m["replicas"])),
                str(max(m["weight_versions"])),
                f"{max(m['static_bytes']) / GB:.1f}",
                f"{max(m['static_unsharded_bytes']) / GB:.1f}",
                str(max(m["peak_activations"])),
                f"{max(m['activation_bytes']) / GB:.1f}",
                f"{max(m['total_bytes']) / GB:.1f} (device {worst})",
                f"{min(m['total_bytes']) / GB:.1f}",
                "yes" if dp.fits_memory(max(m["total_bytes"]), m["capacity_bytes"]) else "no",
            ]
        )
    header = [
        "schedule",
        "N",
        "replicas per device",
        "weight versions (max)",
        "static GB (max)",
        "static GB unsharded",
        "peak activations (stage-microbatches)",
        "activations GB (max)",
        "total GB (max)",
        "total GB (min device)",
        f"fits: at most {runs[0]['memory']['capacity_bytes'] * (1 - dp.HEADROOM) / GB:.1f} of "
        f"{runs[0]['memory']['capacity_bytes'] / GB:.1f} GB ({dp.HEADROOM:.0%} kept free, as plan)" if runs else "fits",
    ]
    return _table(header, rows)


def staleness_table(runs: list[dict]) -> str:
    rows = []
    for r in runs:
        st = r["staleness"]
        rows.append(
            [
                r["schedule"],
                str(r["microbatches"]),
                "stashed (forward's version)" if st["stashing"] else "current",
                str(st["max_updates_between_f_and_b"]),
                f"{st['stale_fraction']:.3f}",
                str(st["stale_per_step"]),
                f"{st['mismatched_fraction']:.3f}",
                f"{st['mismatched_pairs_fraction']:.3f}",
                str(st["first_stage_in_flight"]),
            ]
        )
    header = [
        "schedule",
        "N",
        "weights used by the backward",
        "max updates between F and B",
        "fraction with >= 1 update",
        "such microbatches per step (max)",
        "mismatched fraction",
        "mismatched (stage, microbatch) pairs",
        "first stage in flight (max)",
    ]
    return _table(header, rows)


def figure(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    main = [r for r in runs if r["microbatches"] == MICROBATCHES and r["device"] == DEVICE]
    names = [r["schedule"] for r in main]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    x = np.arange(len(main))
    width = 0.38
    split = [r["throughput"]["samples_per_s"] for r in main]
    balanced = [r["balanced"]["samples_per_s"] for r in main]
    left.bar(x - width / 2, split, width, label="uniform layer split (LM head on the last stage)")
    left.bar(x + width / 2, balanced, width, label="balanced stage times (same total work)")
    for i, value in enumerate(split):
        left.annotate(f"{value:.0f}", (x[i] - width / 2, value), ha="center", va="bottom", fontsize=8)
    for i, value in enumerate(balanced):
        left.annotate(f"{value:.0f}", (x[i] + width / 2, value), ha="center", va="bottom", fontsize=8)
    left.set_xticks(x, names, rotation=20)
    left.set_ylabel("steady-state samples / s")
    left.set_title(f"Throughput, GPT 1.6B, {DEVICES}x{DEVICE} NVLink, N = {MICROBATCHES}")
    left.legend(fontsize=8, loc="upper left")
    left.set_ylim(0, max(split + balanced) * 1.25)

    devices = np.arange(DEVICES)
    for r in main:
        total = np.asarray(r["memory"]["total_bytes"]) / GB
        style = "-o" if r["schedule"] == "amdp" else "--."
        right.plot(devices, total, style, label=r["schedule"], linewidth=2 if r["schedule"] == "amdp" else 1)
    capacity = main[0]["memory"]["capacity_bytes"] / GB
    right.axhline(capacity, color="grey", linestyle=":", label=f"{capacity:.1f} GB")
    right.set_xlabel("device")
    right.set_ylabel("peak memory (GB): static + activations")
    right.set_title("Per-device peak memory")
    right.set_ylim(0, None)
    right.legend(fontsize=8, ncol=2, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="authors' configuration only, shorter windows")
    parser.add_argument("--out", type=Path, default=HERE, help="where to write tables and figure")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    configs = [(MICROBATCHES, DEVICE)]
    if not args.fast:
        configs += [(MICROBATCHES_LARGE, DEVICE), (MICROBATCHES, "H100")]
    runs = []
    for microbatches, device in configs:
        link = LINK if device == DEVICE else "nvlink4"
        for name in SCHEDULES:
            run = evaluate(name, microbatches, fast=args.fast, device=device, link=link)
            runs.append(run)
            t = run["throughput"]
            print(
                f"{device} N={microbatches:3d} {name:17s} {t['samples_per_s']:7.1f} samples/s  "
                f"bubble {t['bubble']:.3f}  peak {max(run['memory']['total_bytes']) / GB:5.1f} GB"
            )

    a100 = [r for r in runs if r["device"] == DEVICE]
    h100 = [r for r in runs if r["device"] != DEVICE]
    note = (
        f"GPT (48 layers, hidden 1600, 25 heads, sequence 1024, microbatch 4, fp16) on {DEVICES} "
        f"{DEVICE} 80GB, one NVLink node ({LINK}); generated by reproduce.py"
        + (" --fast" if args.fast else "")
        + ".\n\n"
    )
    text = note + throughput_table(a100)
    if h100:
        text += "\nSame on H100 (nvlink4):\n\n" + throughput_table(h100)
    (args.out / "throughput.md").write_text(text)
    (args.out / "memory.md").write_text(note + memory_table(a100))
    (args.out / "staleness.md").write_text(note + staleness_table(a100))
    figure(runs, args.out / "amdp.png")
    (args.out / "results.json").write_text(
        json.dumps(
            {
                "config": {"gpt": GPT, "devices": DEVICES, "device": DEVICE, "link": LINK, "fast": args.fast},
                "runs": runs,
            },
            indent=1,
            default=lambda x: None if isinstance(x, float) and math.isnan(x) else x,
        )
        + "\n"
    )
    print(f"wrote {', '.join(p.name for p in sorted(args.out.glob('*')) if p.suffix in ('.md', '.png', '.json'))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
