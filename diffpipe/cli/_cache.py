"""``diffpipe cache``: where the compiled programs and the stage-balancing results kept between runs
are, how many and how large, or removing them."""

from __future__ import annotations

import argparse

from .._caches import CACHE_SWITCH, clear_compilation_cache, compilation_cache_info, compilation_cache_root
from ._outputs import _print_json


def _cmd_cache(args: argparse.Namespace) -> None:
    if args.action == "clear":
        removed = clear_compilation_cache()
        if args.json:
            _print_json({"removed": [str(p) for p in removed]})
            return
        for folder in removed:
            print(f"removed {folder}")
        if not removed:
            print(f"nothing to remove under {compilation_cache_root()}")
        return
    info = compilation_cache_info()
    if args.json:
        _print_json(info)
        return
    state = "on" if info["enabled"] else f"off ({CACHE_SWITCH}=0)"
    print(f"compilation cache  {state}")
    print(f"  path             {info['path']}")
    print(f"  entries          {info['entries']}")
    print(f"  size             {info['bytes'] / 2**20:.1f} MiB")
    kept = info["results"]
    print(f"results            {kept['path']}: {kept['entries']} entries, {kept['bytes'] / 2**20:.1f} MiB "
          "(optimize's, the stage balancing of plan)")
    for other in info["other_versions"]:
        print(f"  other version    {other['path']}: {other['entries']} entries, {other['bytes'] / 2**20:.1f} MiB "
              "(unused; 'diffpipe cache clear' removes it)")
