"""Fused attention of the A100 and the H100 by sequence and per pass, fitted to the FlashAttention papers' figures
(``attention_figures.csv``: every bar label of FlashAttention-2's Figs. 4 and 7 and FlashAttention-3's Fig. 5 as
the flash-attention repository's README images print them; ``kernel_fit.attention_from_figures`` says what is
fitted to what). Writes ``attention_fit.json``: per device the forward curve ``e s / (s + s_half)``, the
backward's rate over the forward's (``attention_backward``), the older generation's rate (``attention_older``) and
every fitted bar, measured against fitted.

    PYTHONPATH=. python papers/kernel-efficiency/fit_attention.py     # seconds; writes attention_fit.json
"""

import json

from kernel_fit import HERE, attention_from_figures

import diffpipe as dp

if __name__ == "__main__":
    out = {device: attention_from_figures(device) for device in ("H100", "A100")}
    path = HERE / "attention_fit.json"
    dp.write_atomic(path, json.dumps(out, indent=1) + "\n", path.name)
    for device, a in out.items():
        print(f"{device}: forward {a['attention_efficiency']} s / (s + {a['attention_half']}), backward x "
              f"{a['attention_backward']}, FlashAttention-1 x {a['attention_older']}; rms log error forward "
              f"{a['rms_log_error_forward']}, forward + backward {a['rms_log_error_combined']} -> {path.name}")
