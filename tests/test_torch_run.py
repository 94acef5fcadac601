"""A real run of exported diffpipe schedules under ``torch.distributed.pipelining``.

Each schedule below is written with ``to_torch_csv``, loaded by torch's ``_PipelineScheduleRuntime``
(``_load_csv(path, format="compute_only")``: torch validates the order, infers the stage-to-rank map,
then lowers it with ``_add_unshard_reshard``, ``_add_reduce_grad`` and ``_add_send_recv``, so the
communication actions come from torch itself) and executed for one training step with the gloo
backend on CPU, in 2 worker processes on loopback, on a tiny model: a stack of ``Linear + Tanh``
blocks, one block per pipeline stage. The losses of the microbatches and the gradient of every
parameter must match a plain, non-pipelined forward and backward of the same model on the same batch.

The workers are this file run as a script (``python tests/test_torch_run.py --worker ...``): one pair
of processes runs every schedule in turn (torch is imported once per process, which keeps the test
within seconds), under a process timeout and a gloo timeout, and is killed on failure. They meet
through a ``FileStore`` in a temporary directory (no port to pick, nothing to race for); gloo's
sockets are bound to the loopback interface (``GLOO_SOCKET_IFNAME=lo``) where it exists.

Every form diffpipe can export runs on CPU: one stage per rank (GPipe, 1F1B), loop placements
(interleaved 1F1B, looped BFS), the zero-bubble I/W split (torch's ``backward_weight_one_chunk``
needs nothing beyond autograd), V placements (ZB-V, DualPipe-V with its overlapped pairs as torch's
``OVERLAP_F_B`` compound cells, Hanayo with one wave) and a custom
greedy order from ``list_schedule``. What cannot run is what the CSV cannot express, and
``to_torch_csv`` refuses it (checked at the end): several pipelines of model replicas (Chimera,
AMDP), placements other than loop or V (Hanayo with two waves), and optimizer steps ``U`` of
asynchronous schedules (PipeDream, PipeDream-2BW), whose updates inside a step torch's one-step
runtime has no action for.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

#: Features of the tiny model and rows of the batch (every microbatch gets BATCH / N rows: 24 splits
#: evenly into the 3 microbatches of the flexible-rounds forms as well as into 4).
WIDTH = 6
BATCH = 24
#: Seconds a gloo operation may wait, and the whole worker pair may run, before being killed.
GLOO_TIMEOUT_S = 20
PROCESS_TIMEOUT_S = 50
RANKS = 2


# -- the model, shared by the workers and the reference run -------------------------------------------


def _model(stages: int):
    """``stages`` blocks, one per pipeline stage, identical in every process (seeded)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.ModuleList([nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(stages)])


def _batch():
    import torch

    generator = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, WIDTH, generator=generator), torch.randn(BATCH, WIDTH, generator=generator)


# -- worker side (this file run as a script) ----------------------------------------------------------


def _run_job(job: dict, rank: int, out: Path) -> None:
    """One training step of ``job["csv"]`` on this rank; saves its losses and gradients."""
    import csv

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _Action, _PipelineScheduleRuntime

    with open(job["csv"], newline="") as handle:
        rows = list(csv.reader(handle))
    actions = [_Action.from_str(cell) for cell in rows[rank] if cell]  # compounds: their sub-actions' stages
    mine = sorted({sub.stage_index for action in actions for sub in action.sub_actions or (action,)})
    model = _model(job["stages"])
    stages = [PipelineStage(model[i], i, job["stages"], torch.device("cpu")) for i in mine]
    runtime = _PipelineScheduleRuntime(stages, job["microbatches"], loss_fn=nn.functional.mse_loss)
    runtime._load_csv(job["csv"], format="compute_only")
    x, y = _batch()
    losses: list = []
    if 0 in mine:
        runtime.step(x, target=y, losses=losses)
    else:
        runtime.step(target=y, losses=losses)
    dist.barrier()
    torch.save(
        {
            "losses": [float(loss) for loss in losses],
            "grads": {i: [p.grad.clone() for p in model[i].parameters()] for i in mine},
            "comms": sum(
                action.computation_type.name in ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
                for action in runtime.pipeline_order_with_comms[rank]
            ),
        },
        out / f"{job['name']}.rank{rank}.pt",
    )


def _worker(rank: int, jobs_path: str) -> None:
    import datetime

    import torch.distributed as dist

    spec = json.loads(Path(jobs_path).read_text())
    out = Path(spec["out"])
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(spec["store"], RANKS),
        rank=rank,
        world_size=RANKS,
        timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S),
    )
    try:
        for job in spec["jobs"]:
            _run_job(job, rank, out)
    finally:
        dist.destroy_process_group()


# -- test side ----------------------------------------------------------------------------------------

if __name__ != "__main__":
    import pytest

    pytest.importorskip("torch.distributed.pipelining")
    import torch
    import torch.distributed as dist

    import diffpipe as dp
    from diffpipe.schedules import Placement, get, list_schedule, to_torch_csv

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

    #: name -> the diffpipe schedule exported for the run (2 ranks).
    FORMS = {
        "1f1b": lambda: get("1f1b", devices=2, microbatches=4),
        "interleaved-1f1b": lambda: get("interleaved-1f1b", devices=2, microbatches=4, chunks=2),
        # torch's flexible rounds: 3 microbatches on 2 ranks (one round of 3).
        "interleaved-1f1b-flexible": lambda: get("interleaved-1f1b", devices=2, microbatches=3, chunks=2),
        "zb-h1-flexible": lambda: get("zb-h1", devices=2, microbatches=3, chunks=2),
        "gpipe": lambda: get("gpipe", devices=2, microbatches=4),
        "looped-bfs": lambda: get("looped-bfs", devices=2, microbatches=4, chunks=2),
        "zb-h1": lambda: get("zb-h1", devices=2, microbatches=4),
        "zb-v": lambda: get("zb-v", devices=2, microbatches=4),
        "dualpipe-v": lambda: get("dualpipe-v", devices=2, microbatches=4),
        "v-half": lambda: get("v-half", devices=2, microbatches=4),
        "v-min": lambda: get("v-min", devices=2, microbatches=4),
        "hanayo": lambda: get("hanayo", devices=2, microbatches=4),
        "greedy-zero-bubble-loop": lambda: list_schedule(
            Placement.loop(2, 2), 4, priority="zero-bubble", split_backward=True
        ),
    }

    @pytest.fixture(scope="module")
    def torch_run(tmp_path_factory):
        """Export every form, run them all in one pair of gloo workers, return the work directory."""
        work = tmp_path_factory.mktemp("torch_run")
        jobs = []
        for name, make in FORMS.items():
            schedule = make()
            path = work / f"{name}.csv"
            to_torch_csv(schedule, path)
            jobs.append(
                {"name": name, "csv": str(path), "stages": schedule.stages, "microbatches": schedule.microbatches}
            )
        spec = work / "jobs.json"
        spec.write_text(json.dumps({"jobs": jobs, "out": str(work), "store": str(work / "store")}))
        from diffpipe.calibrate._ranks import run_ranks  # here: the workers run this file without diffpipe

        return work, run_ranks(__file__, [str(spec)], ranks=RANKS, timeout_s=PROCESS_TIMEOUT_S)

    def _reference(stages: int):
        """Loss and per-stage gradients of the plain model on the whole batch."""
        model = _model(stages)
        x, y = _batch()
        h = x
        for block in model:
            h = block(h)
        loss = torch.nn.functional.mse_loss(h, y)
        loss.backward()
        return loss.item(), {i: [p.grad for p in model[i].parameters()] for i in range(stages)}

    @pytest.mark.parametrize("name", list(FORMS))
    def test_exported_schedule_trains_like_the_plain_model(torch_run, name):
        work, failure = torch_run
        schedule = FORMS[name]()
        files = [work / f"{name}.rank{rank}.pt" for rank in range(RANKS)]
        if not all(f.exists() for f in files):
            pytest.fail(f"the torch run of {name} did not complete:\n{failure}")
        results = [torch.load(f) for f in files]
        # The step ran every stage on the rank diffpipe placed it, with real transfers.
        for rank, result in enumerate(results):
            assert sorted(result["grads"]) == sorted({op.stage for op in schedule.orders[rank]})
            assert result["comms"] > 0
        loss, grads = _reference(schedule.stages)
        losses = [x for result in results for x in result["losses"]]
        assert len(losses) == schedule.microbatches
        # mse_loss averages over a microbatch, and torch scales gradients by 1/N (scale_grads).
        assert sum(losses) / len(losses) == pytest.approx(loss, rel=1e-5)
        got = {stage: g for result in results for stage, g in result["grads"].items()}
        assert sorted(got) == list(range(schedule.stages))
        for stage, expected in grads.items():
            for a, b in zip(got[stage], expected, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)

    @pytest.mark.parametrize(
        "name, options, why",
        [
            ("chimera", {}, "2 pipelines"),
            ("amdp", {}, "2 pipelines"),
            ("dualpipe", {}, "2 pipelines"),
            ("hanayo", {"waves": 2}, "neither a loop"),
            ("pipedream", {}, "optimizer step"),
            ("pipedream-2bw", {}, "optimizer step"),
        ],
    )
    def test_forms_torch_cannot_express_are_refused(tmp_path, name, options, why):
        schedule = get(name, devices=4, microbatches=8, **options)
        path = tmp_path / f"{name}.csv"
        with pytest.raises(dp.ScheduleError, match=why):
            to_torch_csv(schedule, path)
        assert not path.exists()


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "--worker":
        sys.exit("usage: python tests/test_torch_run.py --worker RANK JOBS.json")
    _worker(int(sys.argv[2]), sys.argv[3])
