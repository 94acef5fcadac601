"""compare(): the formula, table and simulation levels, ranks with ties, Kendall tau, flips, output."""

import json
import math

import jax.numpy as jnp
import pytest

import diffpipe as dp
from diffpipe._compare import Machine, _schedule_label, default_machine
from diffpipe._levels import DEFAULT_DEVICES, DEFAULT_MICROBATCHES, DEFAULT_SCHEDULES, LEVELS, kendall_tau, ranks

D = N = 4
# Chimera with its replicas' gradient all-reduce, labelled "chimera" (the mapping form of compare).
FOUR = {"gpipe": "gpipe", "1f1b": "1f1b", "chimera": ("chimera", {"sync": True}), "hanayo": "hanayo"}


def unit_hardware(p2p_time=0.0):
    """Unit times per device share (F = 1, B = 2 for D/S of the model), a fixed p2p delay."""

    def hw(schedule):
        share = schedule.devices / schedule.stages
        return dp.Hardware.from_times(forward=share, input_grad=2.0 * share, p2p_time=p2p_time)

    return hw


def machine(bandwidth=math.inf, latency=0.0):
    """The default machine's model and GPUs, uniform stages, one contended egress lane per GPU
    (the structure papers/tabular-abstraction uses too, so compiled simulators are shared)."""
    base = default_machine()
    lat, bw = jnp.asarray(latency), jnp.asarray(bandwidth)
    network = dp.Network(lat, bw, lat, bw)
    return Machine(base.model, base.device, network, name="test machine", uniform_stages=True,
                   communication="contention", devices_per_node=1)


@pytest.fixture(scope="module")
def free():
    return dp.compare(FOUR, machine(), devices=D, microbatches=N)


@pytest.fixture(scope="module")
def slow():
    return dp.compare(FOUR, machine(bandwidth=0.5e9, latency=1e-5), devices=D, microbatches=N)


# -- the levels ---------------------------------------------------------------------------------------
def test_without_communication_the_simulation_is_the_table(free):
    # Uniform stages with B = 2F (the transformer model's split): the table in units of a forward.
    # Only the embedding departs from it (its gather in F and scatter-add in W move the same bytes
    # at the memory roof, so its B = F): about 2e-5 on this machine, in makespan and bubble.
    forward = free.entries[0].simulation["makespan_s"] / free.entries[0].table["makespan"]
    for e in free.entries:
        assert e.simulation["makespan_s"] == pytest.approx(forward * e.table["makespan"], rel=1e-4)
        assert e.simulation["bubble_ratio"] == pytest.approx(e.table["bubble_ratio"], abs=1e-4)
    pair = free.pair("table", "simulation")
    assert pair.kendall_tau == pytest.approx(1.0) and not pair.flips and not pair.ties_changed
    assert free.ranks["table"] == free.ranks["simulation"]


def test_formula_level_from_the_registry(free):
    gpipe, one, chimera, hanayo = free.entries
    assert gpipe.formula["bubble_ratio"] == pytest.approx((D - 1) / (N + D - 1))
    assert gpipe.formula["makespan"] == pytest.approx(gpipe.table["makespan"])  # the closed form is exact
    assert one.formula["peak_activations"] == D and gpipe.formula["peak_activations"] == N
    # Chimera's closed form needs t_F = t_B: evaluated under that assumption, makespan withheld.
    assert chimera.formula["makespan"] is None and "t_F = t_B" in chimera.formula["assumption"]
    assert chimera.formula["bubble_ratio"] == pytest.approx((D - 2) / (2 * N + D - 2))
    # Hanayo has none: missing, unranked, and left out of the formula's level pairs.
    assert hanayo.formula is None and "no closed form" in hanayo.formula_missing
    assert free.rank("hanayo", "formula") is None
    assert "hanayo" not in free.pair("formula", "table").compared
    assert free.ranking("formula") == ("chimera", "gpipe", "1f1b")


def test_ties_share_a_rank(free):
    assert free.rank("gpipe", "table") == free.rank("1f1b", "table")
    assert free.rank("gpipe", "formula") == free.rank("1f1b", "formula") == 2
    assert "2=" in str(free)


def test_table_scales_chunks_to_the_same_work(free):
    hanayo = free.entry("hanayo")
    assert hanayo.stages == 2 * D
    # Same total work per device as 1F1B: N (F + B) = 12 units, so makespan = 12 / (1 - bubble).
    assert hanayo.table["makespan"] * (1 - hanayo.table["bubble_ratio"]) == pytest.approx(3.0 * N)
    assert hanayo.table["peak_activations"] == max(dp.schedules.peak_activations(
        dp.schedules.get("hanayo", devices=D, microbatches=N))) / 2


def test_communication_flips_the_ranking(slow):
    # Hanayo's chunks double the transfers on the critical path: ahead of GPipe in the table,
    # behind it on a 0.5 GB/s network.
    assert slow.rank("hanayo", "table") < slow.rank("gpipe", "table")
    assert slow.rank("hanayo", "simulation") > slow.rank("gpipe", "simulation")
    pair = slow.pair("table", "simulation")
    assert ("gpipe", "hanayo") in pair.flips
    assert pair.kendall_tau < 1.0 and not slow.invariant
    assert "flips: " in slow.to_markdown()


# -- Kendall tau and ranks ------------------------------------------------------------------------------
def test_kendall_tau_b():
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    # one tie in x: tau-b = (C - D) / sqrt((n0 - n1)(n0 - n2)) = 2 / sqrt(2 * 3)
    assert kendall_tau([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / math.sqrt(6))
    assert kendall_tau([1, 1 + 1e-9, 2], [1, 2, 3]) == pytest.approx(2 / math.sqrt(6))  # within rtol
    assert kendall_tau([1, 1], [1, 2]) is None  # every pair tied in x
    assert kendall_tau([1], [1]) is None
    with pytest.raises(dp.ConfigError, match="different lengths"):
        kendall_tau([1, 2], [1])


def test_competition_ranks():
    assert ranks([3.0, 1.0, 1.0, None, 2.0]) == (4, 1, 1, None, 3)
    assert ranks([1.0, 1.00001, 2.0], rtol=1e-3) == (1, 1, 3)
    assert ranks([1.0, 1.00001, 2.0], rtol=0) == (1, 2, 3)


# -- output -----------------------------------------------------------------------------------------
def test_outputs(slow):
    data = json.loads(slow.to_json())
    assert [s["name"] for s in data["schedules"]] == list(FOUR)
    assert data["levels"] == {"formula": "bubble_ratio", "table": "makespan", "simulation": "makespan"}
    assert data["schedules"][3]["formula"] is None and data["schedules"][3]["rank"]["formula"] is None
    assert [p["levels"] for p in data["pairs"]] == [["formula", "table"], ["formula", "simulation"],
                                                    ["table", "simulation"]]
    assert data["devices"] == D and data["microbatches"] == N
    md = slow.to_markdown()
    assert md.startswith("| schedule |") and md.count("\n| ") == len(FOUR)
    text = str(slow)
    for name in FOUR:
        assert name in text and name in md
    assert "Kendall tau" in text and "hanayo: no formula" in text


# -- inputs -----------------------------------------------------------------------------------------
def test_schedules_options_and_duplicate_labels():
    s = dp.schedules.get("1f1b", devices=D, microbatches=N)
    c = dp.compare([s, "1f1b", ("gpipe", {}), s, ("chimera", {"sync": True})], machine())
    assert c.names == ("1f1b", "1f1b#2", "gpipe", "1f1b#3", "chimera(sync=True)")
    assert c.devices == D and c.microbatches == N
    assert c.ranking("table") == ("chimera(sync=True)", *c.names[:4])  # the rest tie: input order
    synced = dp.schedules.get("chimera", devices=D, microbatches=N, sync=True)
    assert _schedule_label(synced) == "chimera(sync=True)"
    assert _schedule_label(dp.schedules.get("chimera", devices=D, microbatches=N)) == "chimera"


def test_default_machine_is_a_gpt_on_h100_nvlink():
    assert list(DEFAULT_SCHEDULES) == ["gpipe", "1f1b", "chimera", "hanayo"]
    assert DEFAULT_SCHEDULES["chimera"] == ("chimera", {"sync": True})
    assert (DEFAULT_DEVICES, DEFAULT_MICROBATCHES) == (8, 8)
    machine = default_machine()
    assert dp.Machine.default() == machine
    assert "H100" in machine.name and "NVLink" in machine.name
    assert machine.communication == "contention" and machine.devices_per_node == 1
    hw = machine(dp.schedules.get("hanayo", devices=4, microbatches=4))
    assert hw.forward.shape == (8,)  # the model split into Hanayo's 2D stages
    uniform = Machine(machine.model, machine.device, machine.network, uniform_stages=True,
                      communication=machine.communication, devices_per_node=machine.devices_per_node)
    hw = uniform(dp.schedules.get("1f1b", devices=4, microbatches=4))
    assert float(hw.forward.max()) == pytest.approx(float(hw.forward.min()))


def test_default_machine_end_to_end():
    c = dp.compare({k: DEFAULT_SCHEDULES[k] for k in ("1f1b", "chimera")}, devices=D, microbatches=N)
    assert "H100" in c.machine and c.communication == "contention"
    for e in c.entries:
        s = e.simulation
        assert 0 < s["makespan_s"] < 10 and 0 < s["peak_activation_bytes"] < s["peak_memory_bytes"]
        assert isinstance(s["fits"], bool)
    # Two replicas: Chimera holds twice the weights of 1F1B.
    assert c.entry("chimera").simulation["peak_memory_bytes"] > c.entry("1f1b").simulation["peak_memory_bytes"]


def test_fits_is_plan_s_rule_and_bubbles_are_percentages():
    """A peak between the usable memory (capacity less the headroom) and the capacity does not fit, as in
    plan and simulate; headroom 0 is simulate's own ``Result.fits``."""
    from diffpipe._plan._configuration import HEADROOM, fits_memory, usable_memory

    one = dp.Hardware.from_times(forward=1.0, input_grad=2.0, activation_bytes=1e9, static_bytes=1e9)
    peak = float(dp.simulate(dp.schedules.get("1f1b", devices=D, microbatches=N), one).peak_memory.max())
    capacity = peak / (1 - HEADROOM / 2)  # the peak is 95% of the capacity: over 90%, within 100%
    assert not fits_memory(peak, capacity) and peak <= capacity
    hw = dp.Hardware.from_times(forward=1.0, input_grad=2.0, activation_bytes=1e9, static_bytes=1e9, capacity=capacity)
    strict, free = (dp.compare(["1f1b"], hw, devices=D, microbatches=N, headroom=h) for h in (HEADROOM, 0.0))
    assert strict.headroom == HEADROOM and strict.entries[0].simulation["fits"] is False
    assert free.entries[0].simulation["fits"] is True
    assert strict.entries[0].simulation["capacity_bytes"] == pytest.approx(capacity)
    text = str(strict)
    assert f"fits: at most {usable_memory(capacity) / 1e9:.1f} GB of {capacity / 1e9:.1f} GB (10% kept free)" in text
    row = next(line for line in text.splitlines() if line.startswith("1f1b"))
    bubble = strict.entries[0].simulation["bubble_ratio"]
    assert f"{100 * bubble:.1f}" in row.split() and row.split()[-1] == "NO" and "sim bubble (%)" in text
    assert json.loads(strict.to_json())["headroom"] == HEADROOM
    with pytest.raises(dp.ConfigError, match="compare: headroom must be below 1"):
        dp.compare(["1f1b"], hw, devices=D, microbatches=N, headroom=1.0)


@pytest.mark.parametrize(
    "args, kwargs, error, message",
    [
        (["nope"], dict(devices=4, microbatches=4), dp.ScheduleError, "unknown schedule family 'nope'"),
        (["chimera"], dict(devices=4, microbatches=6), dp.ScheduleError, "chimera: microbatches must be"),
        ([], dict(devices=4, microbatches=4), dp.ConfigError, "at least one"),
        ([3], dict(devices=4, microbatches=4), dp.ConfigError, "cannot compare 3"),
        (["gpipe"], dict(devices=4, microbatches=4, rtol=-1), dp.ConfigError, "rtol"),
        (["gpipe"], dict(devices=4, microbatches=4, durations={"X": 1}), dp.ScheduleError, "unknown op kind"),
        (["gpipe"], dict(devices=4, microbatches=4, durations={"F": -1}), dp.ConfigError, "duration of F"),
    ],
)
def test_errors(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        dp.compare(args, unit_hardware(), **kwargs)


def test_hardware_errors():
    with pytest.raises(dp.ConfigError, match="hanayo has 8 stages per pipeline and gpipe 4"):
        dp.compare(["gpipe", "hanayo"], dp.Hardware.from_times(1.0, 2.0), devices=4, microbatches=4)
    with pytest.raises(dp.ConfigError, match="hardware must be"):
        dp.compare(["gpipe"], 3.0, devices=4, microbatches=4)
    with pytest.raises(dp.ConfigError, match="returned str for gpipe"):
        dp.compare(["gpipe"], lambda s: "fast", devices=4, microbatches=4)
    s = dp.schedules.get("gpipe", devices=2, microbatches=2)
    with pytest.raises(dp.ConfigError, match="gpipe has 2 devices and 2 microbatches, the comparison 4 and 4"):
        dp.compare([s], unit_hardware(), devices=4, microbatches=4)
    with pytest.raises(dp.ConfigError, match="needs 16 stages, the model has only 8 layers"):
        small = dp.Transformer(layers=8, hidden=64, heads=4, sequence=32, vocabulary=100)
        machine = default_machine()
        dp.compare(["hanayo"], Machine(small, machine.device, machine.network), devices=8, microbatches=8)


def test_unknown_level(free):
    for call in (lambda: free.ranking("bubble"), lambda: free.rank("gpipe", "x"), lambda: free.pair("table", "x")):
        with pytest.raises(dp.ConfigError, match="unknown level"):
            call()
    with pytest.raises(dp.ConfigError, match="no schedule 'zb-h1'"):
        free.entry("zb-h1")
    assert set(free.ranks) == set(LEVELS)


def test_peak_activation_bytes_match_the_simulator():
    import equinox as eqx

    from diffpipe.schedules._analysis import activation_bytes_peaks

    s = dp.schedules.get("chimera", devices=D, microbatches=N, sync=True)
    hw = machine()(s)
    hw = eqx.tree_at(lambda h: (h.static_bytes, h.activation_bytes), hw,
                     (jnp.zeros_like(hw.static_bytes), jnp.asarray([1.0, 2.0, 3.0, 4.0])))
    peaks = activation_bytes_peaks(s, hw.activation_bytes, hw.size)
    assert peaks == pytest.approx(tuple(float(x) for x in dp.simulate(s, hw, communication="contention").peak_memory))


def test_the_simulation_level_is_simulate_s_bit_for_bit_from_one_program():
    # graphs of different sizes pad to their common sizes: one compiled program, simulate's numbers
    from diffpipe._engine._batch import batched_simulation

    names = ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipe-v", "chimera"]
    hardware = default_machine()
    batched_simulation._cached.clear_cache()
    c = dp.compare(names, hardware, devices=D, microbatches=2 * N)
    assert batched_simulation._cached._cache_size() == 1
    for name, e in zip(names, c.entries):
        s = dp.schedules.get(name, devices=D, microbatches=2 * N)
        result = dp.simulate(s, hardware(s), communication=hardware.communication)
        assert e.simulation["makespan_s"] == float(result.makespan), name
        assert e.simulation["bubble_ratio"] == float(result.bubble_ratio), name
        assert e.simulation["peak_memory_bytes"] == float(result.peak_memory.max()), name
    custom = dp.compare(["1f1b", "zb-h1"], unit_hardware(p2p_time=0.5), devices=D, microbatches=N)
    for e in custom.entries:  # a callable's Hardware takes the same path
        s = dp.schedules.get(e.family, devices=D, microbatches=N)
        assert e.simulation["makespan_s"] == float(dp.simulate(s, unit_hardware(p2p_time=0.5)(s)).makespan)


def test_a_machine_file_s_devices_per_node_goes_to_compile(tmp_path, capsys):
    """``[network] devices_per_node`` is the topology schedules compile under (``FileMachine``
    carries it, the ``Network`` holds none): 8 where ``inter`` is given without it, 1 on the
    default machine's links, none (one node) for an intra link alone; the CLI simulates under it."""
    from diffpipe import cli

    files = {2: '[network]\nintra = "nvlink3"\ninter = "ib-ndr"\ndevices_per_node = 2\n',
             8: '[network]\nintra = "nvlink3"\ninter = "ib-ndr"\n', 1: '[device]\npreset = "A100"\n',
             None: '[network]\nintra = "nvlink3"\n'}
    schedule = dp.schedules.get("1f1b", devices=4, microbatches=4)
    for per_node, text in files.items():
        path = tmp_path / f"m{per_node}.toml"
        path.write_text(text)
        machine = dp.load_machine(path)
        assert machine.devices_per_node == per_node and not hasattr(machine.network, "devices_per_node")
        want = dp.simulate(schedule, machine.hardware(schedule), communication=machine.communication,
                           devices_per_node=machine.devices_per_node)
        assert want.devices_per_node == (per_node or 4)
        assert cli.main(["simulate", "1f1b", "--devices", "4", "--microbatches", "4", "--json",
                         "--config", str(path)]) == 0
        assert json.loads(capsys.readouterr().out)["makespan_s"] == float(want.makespan), per_node
        if per_node == 2:  # the stage pair 1 -> 2 crosses nodes: NDR, not NVLink
            one_node = dp.simulate(schedule, machine.hardware(schedule), communication=machine.communication)
            assert float(want.makespan) > float(one_node.makespan)
