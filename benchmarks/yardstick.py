"""The yardstick: a plain single-threaded compiled max-plus loop over a graph's topological order.

C, built by this module with ``gcc -O3 -march=native`` in a temporary directory and loaded with
ctypes (a benchmark tool, not a runtime dependency). It reads the same cost tables as diffpipe
(``Hardware.tables``: a node lasts ``base[row] + size[m] * per_size[row]``, a transfer edge delays by
``edge_base[row] + size[m] * edge_per_size[row]``) and keeps the batch lanes innermost, in chunks of
``W`` lanes so that a chunk's finish times stay in cache: the simplest fast loop a person would
write for exact max-plus evaluation of many hardware variants.

Tightened (issue 21: the first version ran 1.3-1.5x slower than this one on the benchmark machine):
the chunk width is a compile-time constant (one library per width, the batch padded to a multiple
of it with copies of the last variant), so the lane loops have no remainder and the accumulator
stays in registers; pointers are ``restrict``; padded predecessor slots (the graph's sentinel) are
skipped; 512-bit vectors where the compiler accepts ``-mprefer-vector-width=512``. Each
``Yardstick`` times every built width on its graph and keeps the fastest (``WIDTHS``).
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

_SOURCE = r"""
#include <math.h>
void maxplus(int n, int k, int batch, const int *restrict pred, const int *restrict node_row,
             const int *restrict edge_row, const int *restrict microbatch, const float *restrict base,
             const float *restrict per, const float *restrict ebase, const float *restrict eper,
             const float *restrict size, int sentinel, float *restrict finish) {
    /* batch: a multiple of W; finish: [sentinel + 1][W] per chunk of W lanes */
    for (int c0 = 0; c0 < batch; c0 += W) {
        float *restrict fin = finish + (long)c0 * (sentinel + 1);
        for (int v = 0; v < W; v++) fin[(long)sentinel * W + v] = -INFINITY;
        for (int i = 0; i < n; i++) {
            const float *restrict s = size + (long)microbatch[i] * batch + c0;
            const float *restrict b = base + (long)node_row[i] * batch + c0;
            const float *restrict p = per + (long)node_row[i] * batch + c0;
            float acc[W];
            for (int v = 0; v < W; v++) acc[v] = 0.0f;
            for (int j = 0; j < k; j++) {
                const int q = pred[i * k + j];
                if (q == sentinel) continue;
                const float *restrict fp = fin + (long)q * W;
                const float *restrict eb = ebase + (long)edge_row[i * k + j] * batch + c0;
                const float *restrict ep = eper + (long)edge_row[i * k + j] * batch + c0;
                for (int v = 0; v < W; v++) {
                    float a = fp[v] + eb[v] + s[v] * ep[v];
                    acc[v] = a > acc[v] ? a : acc[v];  /* not fmaxf: this vectorises without -ffast-math */
                }
            }
            float *restrict f = fin + (long)i * W;
            for (int v = 0; v < W; v++) f[v] = b[v] + s[v] * p[v] + acc[v];
        }
    }
}
"""

#: Chunk widths built (lanes per chunk); the fastest on a graph is its yardstick.
WIDTHS = (32, 64, 128)
#: Timed calls per width when a ``Yardstick`` picks its width.
_TRIALS = 3


def available() -> bool:
    return shutil.which("gcc") is not None


def build() -> dict[int, ctypes.CDLL]:
    """Compile the loop once per width in ``WIDTHS`` (``gcc -O3 -march=native``) and load them."""
    tmp = Path(tempfile.mkdtemp(prefix="diffpipe-yardstick-"))
    src = tmp / "maxplus.c"
    src.write_text(_SOURCE)
    libs = {}
    for width in WIDTHS:
        lib = tmp / f"maxplus{width}.so"
        base = ["gcc", "-O3", "-march=native", f"-DW={width}", "-shared", "-fPIC", "-o", str(lib), str(src), "-lm"]
        wide = subprocess.run([*base[:3], "-mprefer-vector-width=512", *base[3:]], capture_output=True)
        if wide.returncode != 0:  # not an x86 compiler: its own vector width
            subprocess.run(base, check=True)
        libs[width] = ctypes.CDLL(str(lib))
    return libs


class Yardstick:
    """``Yardstick(libs, graph, tables)()`` -> makespan ``[batch]`` (exact), tables batch-last numpy;
    ``width`` is the chunk width it runs (the fastest of ``libs`` on this graph)."""

    def __init__(self, libs: dict[int, ctypes.CDLL], graph, tables):
        kind = np.asarray(graph.kind)
        self.n = int(np.sum(kind >= 0))  # real nodes come first, in topological order
        self.k = int(graph.pred.shape[-1])
        self.sentinel = int(graph.sentinel)

        def ints(x):
            return np.ascontiguousarray(np.asarray(x), dtype=np.int32)

        self.pred, self.node_row = ints(graph.pred), ints(graph.node_row)
        self.edge_row, self.microbatch = ints(graph.edge_row), ints(graph.microbatch)
        self.real = np.asarray(tables.base).shape[-1]
        self.sinks = np.asarray(graph.sinks)
        self.libs, self.tables = libs, tables
        times = {}
        for width in libs:
            self._use(width)
            self()
            times[width] = min(_timed(self) for _ in range(_TRIALS))
        self._use(min(times, key=times.get))

    def _use(self, width: int) -> None:
        self.width, self.fn = width, self.libs[width].maxplus
        self.batch = -(-self.real // width) * width

        def floats(x):  # batch-last, padded to a multiple of the width with copies of the last lane
            x = np.asarray(x, dtype=np.float32)
            pad = self.batch - x.shape[-1]
            x = np.concatenate([x, np.repeat(x[..., -1:], pad, axis=-1)], axis=-1) if pad else x
            return np.ascontiguousarray(x)

        t = self.tables
        self.base, self.per = floats(t.base), floats(t.per_size)
        self.ebase, self.eper, self.size = floats(t.edge_base), floats(t.edge_per_size), floats(t.size)
        self.finish = np.empty((self.sentinel + 1) * self.batch, dtype=np.float32)

    def __call__(self) -> np.ndarray:
        def ptr(x):
            return x.ctypes.data_as(ctypes.c_void_p)

        self.fn(ctypes.c_int(self.n), ctypes.c_int(self.k), ctypes.c_int(self.batch), ptr(self.pred),
                ptr(self.node_row), ptr(self.edge_row), ptr(self.microbatch), ptr(self.base), ptr(self.per),
                ptr(self.ebase), ptr(self.eper), ptr(self.size), ctypes.c_int(self.sentinel), ptr(self.finish))
        rows, w = self.sentinel + 1, self.width
        fin = self.finish.reshape(self.batch // w, rows, w)  # [chunk, row, lane]
        out = fin[:, self.sinks].max(axis=1).reshape(self.batch)
        return out[: self.real]


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
