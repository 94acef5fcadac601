#!/usr/bin/env bash
# Run every benchmark unchanged on whatever JAX backend is present (CPU, GPU or TPU). Each script
# writes benchmarks/results/<name>-<backend>.json, tagged with jax.default_backend(); this script
# also keeps the printed tables in benchmarks/results/<name>-<backend>.txt.
#
#   benchmarks/run_all.sh [--quick]        # --quick: smoke sizes (bench_sweep gets --points 20000),
#                                          # written to <name>-<backend>-quick.* (committed results stay)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
python="${PYTHON:-python}"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
backend="$("$python" -c 'import jax; print(jax.default_backend())')"
quick=()
sweep_args=()
if [[ "${1:-}" == "--quick" ]]; then
  quick=(--quick)
  sweep_args=(--points 20000 --sample 20)
fi
mkdir -p "$here/results"
echo "backend: $backend"
tag="$backend"
[[ ${#quick[@]} -gt 0 ]] && tag="$backend-quick"
for bench in simulator optimize sweep; do
  args=("${quick[@]}")
  [[ "$bench" == sweep ]] && args=("${sweep_args[@]}")
  args+=(--out "$here/results/$bench-$tag.json")
  echo "== bench_$bench.py ${args[*]}"
  "$python" "$here/bench_$bench.py" "${args[@]}" | tee "$here/results/$bench-$tag.txt"
done
