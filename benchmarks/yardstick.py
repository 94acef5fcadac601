"""The yardstick: a plain single-threaded compiled max-plus loop over a graph's topological order.

C, built by this module with ``gcc -O3 -march=native`` in a temporary directory and loaded with
ctypes (a benchmark tool, not a runtime dependency). It reads the same cost tables as diffpipe
(``Hardware.tables``: a node lasts ``base[row] + size[m] * per_size[row]``, a transfer edge delays by
``edge_base[row] + size[m] * edge_per_size[row]``) and keeps the batch lanes innermost, in chunks of
128 lanes so that a chunk's finish times stay in cache: the simplest fast loop a person would
write for exact max-plus evaluation of many hardware variants.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

_SOURCE = r"""
#include <math.h>
void maxplus(int n, int k, int batch, int chunk, const int *pred, const int *node_row,
             const int *edge_row, const int *microbatch, const float *base, const float *per,
             const float *ebase, const float *eper, const float *size, int sentinel, float *finish) {
    /* finish: [sentinel + 1][chunk] scratch per chunk; out: makespan inputs written back per chunk */
    for (int c0 = 0; c0 < batch; c0 += chunk) {
        int w = batch - c0 < chunk ? batch - c0 : chunk;
        float *fin = finish + (long)c0 * (sentinel + 1);
        for (int v = 0; v < w; v++) fin[(long)sentinel * w + v] = -INFINITY;
        for (int i = 0; i < n; i++) {
            const float *s = size + (long)microbatch[i] * batch + c0;
            float acc[512];
            for (int v = 0; v < w; v++) acc[v] = 0.0f;
            for (int j = 0; j < k; j++) {
                const float *fp = fin + (long)pred[i * k + j] * w;
                const float *eb = ebase + (long)edge_row[i * k + j] * batch + c0;
                const float *ep = eper + (long)edge_row[i * k + j] * batch + c0;
                for (int v = 0; v < w; v++) {
                    float a = fp[v] + eb[v] + s[v] * ep[v];
                    acc[v] = a > acc[v] ? a : acc[v];  /* not fmaxf: this vectorises without -ffast-math */
                }
            }
            const float *b = base + (long)node_row[i] * batch + c0, *p = per + (long)node_row[i] * batch + c0;
            float *f = fin + (long)i * w;
            for (int v = 0; v < w; v++) f[v] = b[v] + s[v] * p[v] + acc[v];
        }
    }
}
"""

CHUNK = 128


def available() -> bool:
    return shutil.which("gcc") is not None


def build() -> ctypes.CDLL:
    """Compile the loop (``gcc -O3 -march=native``) and load it."""
    tmp = Path(tempfile.mkdtemp(prefix="diffpipe-yardstick-"))
    src, lib = tmp / "maxplus.c", tmp / "maxplus.so"
    src.write_text(_SOURCE)
    subprocess.run(["gcc", "-O3", "-march=native", "-shared", "-fPIC", "-o", str(lib), str(src), "-lm"], check=True)
    return ctypes.CDLL(str(lib))


class Yardstick:
    """``Yardstick(lib, graph, tables)()`` -> makespan ``[batch]`` (exact), tables batch-last numpy."""

    def __init__(self, lib: ctypes.CDLL, graph, tables):
        kind = np.asarray(graph.kind)
        self.n = int(np.sum(kind >= 0))  # real nodes come first, in topological order
        self.k = int(graph.pred.shape[-1])
        self.sentinel = int(graph.sentinel)

        def ints(x):
            return np.ascontiguousarray(np.asarray(x), dtype=np.int32)

        def floats(x):
            return np.ascontiguousarray(np.asarray(x), dtype=np.float32)

        self.pred, self.node_row = ints(graph.pred), ints(graph.node_row)
        self.edge_row, self.microbatch = ints(graph.edge_row), ints(graph.microbatch)
        self.base, self.per = floats(tables.base), floats(tables.per_size)
        self.ebase, self.eper, self.size = floats(tables.edge_base), floats(tables.edge_per_size), floats(tables.size)
        self.batch = self.base.shape[-1]
        self.sinks = np.asarray(graph.sinks)
        self.finish = np.empty((self.sentinel + 1) * self.batch, dtype=np.float32)
        self.fn = lib.maxplus

    def __call__(self) -> np.ndarray:
        def ptr(x):
            return x.ctypes.data_as(ctypes.c_void_p)

        self.fn(ctypes.c_int(self.n), ctypes.c_int(self.k), ctypes.c_int(self.batch), ctypes.c_int(CHUNK),
                ptr(self.pred), ptr(self.node_row), ptr(self.edge_row), ptr(self.microbatch), ptr(self.base),
                ptr(self.per), ptr(self.ebase), ptr(self.eper), ptr(self.size), ctypes.c_int(self.sentinel),
                ptr(self.finish))
        out = np.empty(self.batch, dtype=np.float32)
        rows = self.sentinel + 1
        for c0 in range(0, self.batch, CHUNK):
            w = min(CHUNK, self.batch - c0)
            fin = self.finish[c0 * rows: c0 * rows + rows * w].reshape(rows, w)
            out[c0: c0 + w] = fin[self.sinks].max(axis=0)
        return out
