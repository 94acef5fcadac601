"""The result protocol, implemented once: ``to_json`` / ``to_csv`` / ``to_markdown`` text.

Every result type (``Result``, ``Comparison``, ``OptimizeResult``, ``SweepResult``) has
``to_dict()`` (plain data), ``to_json(path=None, indent=2)`` (strict JSON text: NaN and infinities
become ``null``; written atomically when ``path`` is given) and, where it is a table, ``to_csv`` and
``to_markdown``. No JAX here.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ._io import dumps_json, json_safe, write_atomic


def json_text(data: Mapping[str, Any], path: str | os.PathLike | None = None, indent: int | None = 2) -> str:
    """Strict JSON text of ``data``; also written atomically to ``path`` when given."""
    text = dumps_json(data, indent)
    if path is not None:
        write_atomic(path, text, "json output")
    return text


def csv_text(header: Sequence[str], rows: Sequence[Sequence[Any]], path: str | os.PathLike | None = None) -> str:
    """CSV text (``null``-like values empty); also written atomically to ``path`` when given."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    for row in rows:
        writer.writerow(["" if v is None else v for v in json_safe(list(row))])
    text = buffer.getvalue()
    if path is not None:
        write_atomic(path, text, "csv output")
    return text


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table of already formatted cells."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def percent(fraction: Any) -> str:
    """A share (MFU, bubble, communication) as every table prints it: a percentage with one decimal,
    the column's header saying ``(%)`` (``0.1234`` -> ``"12.3"``)."""
    return f"{100 * float(fraction):.1f}"


__all__ = ["csv_text", "json_text", "markdown_table", "percent"]
