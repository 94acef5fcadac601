"""Run a script as several local ranks (gloo on loopback), as a profiled pipelined step needs.

Stdlib only: the workers import torch, this process does not.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path


def run_ranks(script: str | os.PathLike, args: Sequence[str], *, ranks: int, timeout_s: float,
              env: Mapping[str, str] | None = None) -> str | None:
    """Run ``python script --worker RANK *args`` for every rank at once, with ``MASTER_ADDR`` on
    loopback (and gloo bound to ``lo`` where it exists); every process is killed once one times
    out. Returns None when all exit 0, else, for each rank that did not, its exit code and the tail
    of its output."""
    full = {**os.environ, "MASTER_ADDR": "127.0.0.1", "PYTHONUNBUFFERED": "1", **(env or {})}
    if Path("/sys/class/net/lo").exists():
        full["GLOO_SOCKET_IFNAME"] = "lo"
    procs = [
        subprocess.Popen([sys.executable, str(script), "--worker", str(rank), *args], env=full,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in range(ranks)
    ]
    logs = []
    try:
        for rank, proc in enumerate(procs):
            try:
                logs.append(proc.communicate(timeout=timeout_s)[0])
            except subprocess.TimeoutExpired:
                for other in procs:
                    other.kill()
                logs.append(proc.communicate()[0] + f"\nworker {rank} timed out after {timeout_s} s")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    failed = [rank for rank, p in enumerate(procs) if p.returncode != 0]
    if not failed:
        return None
    # each failing rank's exit code and the tail of its own output (one rank's long log, or the
    # other rank's traceback of a dropped connection, must not hide the first failure)
    return "\n".join(f"worker {rank} exited with {procs[rank].returncode}:\n{logs[rank][-2000:]}"
                     for rank in failed)
