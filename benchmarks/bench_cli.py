"""The README's commands from a fresh shell: each in a new process, cold (an empty compilation cache)
and warm (the cache the cold run left), against ``python -c "import jax"`` in the same run.

Run by hand (nothing in CI depends on a timing):

    python benchmarks/bench_cli.py [--rounds 2] [--plan] [--only compare,simulate] [--out PATH]

Commands: ``diffpipe compare``, ``diffpipe simulate --config examples/llama3-70b.toml`` and, with
``--plan``, the README's ``diffpipe plan --model llama-3-70b --gpus 256 --global-batch 256
--families 1f1b,interleaved-1f1b --export megatron --out ...`` (minutes cold on a 2-core CPU).
Each round runs, per command, a cold process in a new empty ``DIFFPIPE_CACHE_DIR`` and then a
warm one reusing it, with ``JAX_LOG_COMPILES=1`` to count the programs: compiled by XLA (cold) or
loaded from the cache (warm). ``--no-cache`` also times the command with the cache turned off.
The yardstick, ``python -c "import jax"``, runs in every round. Reported per command: the
fastest and slowest wall time over the rounds, the programs compiled and loaded, and the cache's
size on disk after the cold run. Every process's stdout is compared with the first one's: the
cache must not change an answer. The machine is whatever runs it: read the ratios to the
yardstick; a shared machine varies by +-30% between rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {
    "compare": ["compare"],
    "simulate": ["simulate", "--config", "examples/llama3-70b.toml"],
    "plan": ["plan", "--model", "llama-3-70b", "--gpus", "256", "--global-batch", "256",
             "--families", "1f1b,interleaved-1f1b", "--export", "megatron", "--out", "{out}/megatron.args"],
}


def _env(cache: Path | None, repo: Path = ROOT) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DIFFPIPE_CACHE", "JAX_COMPILATION_CACHE"))}
    env["PYTHONPATH"] = os.pathsep.join([str(repo), *filter(None, [env.get("PYTHONPATH")])])
    env["JAX_LOG_COMPILES"] = "1"
    if cache is None:
        env["DIFFPIPE_CACHE"] = "0"
    else:
        env["DIFFPIPE_CACHE_DIR"] = str(cache)
    return env


def _run(argv: list[str], env: dict[str, str], timeout: float) -> dict:
    t = time.perf_counter()
    repo = env["PYTHONPATH"].split(os.pathsep)[0]  # the checkout run: `-m` puts the cwd first on sys.path
    done = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    log = done.stderr
    compiled = len(re.findall(r"^Finished XLA compilation", log, re.M))
    loaded = len(re.findall(r"^Persistent compilation cache hit", log, re.M))
    return {"wall_s": wall, "programs": compiled, "compiled": compiled - loaded, "loaded": loaded,
            "stdout": done.stdout}


def _size(folder: Path) -> tuple[int, int]:
    files = [f for f in folder.rglob("*") if f.is_file()]
    return len(files), sum(f.stat().st_size for f in files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--plan", action="store_true", help="also the README plan (minutes cold)")
    parser.add_argument("--only", help="comma-separated commands (compare, simulate, plan)")
    parser.add_argument("--no-cache", action="store_true", dest="no_cache", help="also time with the cache off")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per process")
    parser.add_argument("--repo", type=Path, default=ROOT,
                        help="the diffpipe checkout to run (default this one; another for a before/after)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "cli-cpu.json")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else ["compare", "simulate"] + (["plan"] if args.plan else [])
    unknown = sorted(set(names) - set(COMMANDS))
    if unknown:
        parser.error(f"unknown command(s) {unknown}; choose from {sorted(COMMANDS)}")

    runs: dict[str, dict[str, list]] = {n: {"cold": [], "warm": [], "off": []} for n in names}
    yardstick: list[float] = []
    cache_size: dict[str, tuple[int, int]] = {}
    answers: dict[str, str] = {}
    scratch = Path(tempfile.mkdtemp(prefix="bench_cli-"))
    try:
        for r in range(args.rounds):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import jax"], check=True, env=_env(None))
            yardstick.append(time.perf_counter() - t)
            for name in names:
                out = scratch / f"out-{name}"  # one path: the command prints it
                out.mkdir(exist_ok=True)
                argv = [sys.executable, "-m", "diffpipe", *(a.format(out=out) for a in COMMANDS[name])]
                cache = scratch / f"cache-{r}-{name}"
                kinds = [("cold", cache), ("warm", cache)] + ([("off", None)] if args.no_cache else [])
                for kind, folder in kinds:
                    for old in out.iterdir():
                        old.unlink()
                    result = _run(argv, _env(folder, args.repo.resolve()), args.timeout)
                    answers.setdefault(name, result["stdout"])
                    if result["stdout"] != answers[name]:
                        raise SystemExit(f"{name} ({kind}) answered differently from its first run")
                    del result["stdout"]
                    runs[name][kind].append(result)
                    if kind == "cold":
                        cache_size[name] = _size(cache)
                    print(f"round {r + 1} {name:<9} {kind:<5} {result['wall_s']:7.1f} s  "
                          f"{result['compiled']} compiled, {result['loaded']} loaded", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    def span(values: list[float]) -> str:
        return f"{min(values):.1f}" if len(values) == 1 else f"{min(values):.1f}-{max(values):.1f}"

    jax_s = span(yardstick)
    print(f"\nyardstick: python -c \"import jax\" {jax_s} s ({args.rounds} rounds)\n")
    print("| command | cold (empty cache) | warm (with the cache) | cache off | programs cold: compiled | "
          "warm: loaded / compiled | cache on disk |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in names:
        cold, warm, off = (runs[name][k] for k in ("cold", "warm", "off"))
        entries, size = cache_size[name]
        print(f"| `diffpipe {' '.join(COMMANDS[name][:3])}` | {span([x['wall_s'] for x in cold])} s | "
              f"{span([x['wall_s'] for x in warm])} s | {span([x['wall_s'] for x in off]) + ' s' if off else '-'} | "
              f"{cold[0]['compiled']} | {warm[0]['loaded']} / {warm[0]['compiled']} | "
              f"{entries} files, {size / 2**20:.1f} MiB |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {"repo": str(args.repo), "machine": platform.platform(), "cpus": os.cpu_count(),
              "python": sys.version.split()[0],
              "load_average": os.getloadavg(), "yardstick_import_jax_s": yardstick,
              "commands": {n: " ".join(COMMANDS[n]) for n in names}, "runs": runs,
              "cache_files_bytes": cache_size}
    try:
        import jax

        record["jax"] = jax.__version__
    except ImportError:
        pass
    from diffpipe import write_atomic  # the package's one atomic writer
    write_atomic(args.out, json.dumps(record, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
