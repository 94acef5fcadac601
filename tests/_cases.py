"""Schedules shared by the simulator tests: every family at a few sizes (those that are registered)."""

import diffpipe as dp

CASES = [
    ("gpipe", 3, 4, {}),
    ("1f1b", 4, 6, {}),
    ("interleaved-1f1b", 2, 4, {"chunks": 2}),
    ("looped-bfs", 2, 3, {"chunks": 2}),
    ("chimera", 4, 4, {}),
    ("chimera-asymmetric", 4, 4, {}),
    ("hanayo", 2, 2, {"waves": 2}),
    ("zb-h1", 3, 4, {}),
    ("zb-h2", 3, 4, {}),
    ("zb-v", 2, 4, {}),
    ("dualpipe-v", 2, 4, {}),
    ("pipedream", 3, 6, {}),
    ("pipedream-2bw", 2, 4, {}),
    ("amdp", 4, 8, {}),
]


def schedules():
    """(case id, schedule) for every case whose family loads with these arguments."""
    out = []
    for name, devices, microbatches, options in CASES:
        try:
            s = dp.schedules.get(name, devices=devices, microbatches=microbatches, **options)
        except (ImportError, AttributeError):  # family not written yet
            continue
        except dp.ScheduleError:
            continue
        out.append((f"{name}-{devices}x{microbatches}", s))
    return out
