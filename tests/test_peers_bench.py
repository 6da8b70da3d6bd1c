"""benchmarks/peers.py, the CPU comparison with each framework's own RNN: its rows, its
arithmetic, and one real row timed in two processes; benchmarks/compile_floor.py, the
floor under its torch.compile rows; benchmarks/import_cost.py, what importing an adapter adds
to importing its framework."""

import importlib.util
import json
import pathlib

import pytest

from conftest import benchmark_script

peers = benchmark_script("peers")


def test_every_row_the_issue_names_is_there():
    rows = list(peers.rows(peers.PATHS, peers.SIZES, peers.CELLS))
    assert len(rows) == len(set(rows))
    keras = [r for r in rows if r[0].startswith("keras")]
    assert {r[3] for r in keras} == {"lstm", "gru"}  # no SimpleRNN layer of ours
    torch = [r for r in rows if r[0] == "torch"]
    assert len(torch) == 3 * 2 * 3 * 2 * 2  # sizes, kinds, cells, directions, lengths


def test_kinds_and_lengths_pick_a_subset_of_rows():
    rows = list(peers.rows(["torch", "numpy"], ["large"], ["lstm"], ["forward"], ["ragged"]))
    assert rows == [("torch", "large", "forward", "lstm", bidirectional, True)
                    for bidirectional in (False, True)]  # numpy has no forward rows


def test_the_summary_is_the_median_of_rounds_and_their_spread():
    figures = {("torch", "small", "step", "lstm", False, True):
               {"ours": [2.0, 4.0, 3.0], "theirs": [4.0, 6.0, 5.0]}}
    (row,) = peers.summary(figures)
    assert (row["ours_ms"], row["theirs_ms"], row["ratio"]) == (3.0, 5.0, 0.6)
    assert (row["ours_spread"], row["theirs_spread"]) == (2.0, 1.5)
    assert "torch" in peers.table([row]) and "ragged" in peers.table([row])


def test_ragged_lengths_are_unsorted_and_in_range():
    lengths = peers._lengths(32, 16)
    assert len(lengths) == 16 and min(lengths) >= 8 and max(lengths) == 32
    assert lengths != sorted(lengths, reverse=True)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_one_row_runs_each_side_in_a_process_of_its_own(monkeypatch):
    sides = []  # one process per side and round: the command line of each
    real = peers.subprocess.run
    monkeypatch.setattr(peers.subprocess, "run",
                        lambda command, **k: sides.append(command[6]) or real(command, **k))
    figures = peers.measure([("numpy", "small", "step", "rnn_tanh", False, False)], rounds=2,
                            seconds=0.02, progress=lambda line: None)
    (times,) = figures.values()
    assert all(len(times[side]) == 2 and min(times[side]) > 0 for side in times)
    assert sides == ["ours", "theirs", "theirs", "ours"]  # alternating


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_the_control_runs_the_peer_on_both_sides(monkeypatch):
    sides = []
    real = peers.subprocess.run
    monkeypatch.setattr(peers.subprocess, "run",
                        lambda command, **k: sides.append(command[6]) or real(command, **k))
    figures = peers.measure([("numpy", "small", "step", "rnn_tanh", False, False)], rounds=2,
                            seconds=0.02, progress=lambda line: None, control=True)
    (times,) = figures.values()
    assert all(len(times[side]) == 2 for side in times)
    assert sides == ["theirs"] * 4


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_the_compile_floor_times_both_steps_in_processes_of_their_own(monkeypatch):
    # It imports peers, as when run from benchmarks/.
    monkeypatch.syspath_prepend(str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
    floor = benchmark_script("compile_floor")
    kinds = []
    real = floor.subprocess.run
    monkeypatch.setattr(floor.subprocess, "run",
                        lambda command, **k: kinds.append(command[3]) or real(command, **k))
    times = floor.measure(rounds=2, seconds=0.02)
    assert all(len(times[kind]) == 2 and min(times[kind]) > 0 for kind in floor.KINDS)
    assert kinds == ["compiled", "eager", "eager", "compiled"]  # alternating


def test_the_import_cost_times_both_sides_in_fresh_processes_alternating(monkeypatch):
    cost = benchmark_script("import_cost")
    name = next((n for n in ("jax", "torch") if cost.available(n)), None)
    if name is None:
        pytest.skip("needs jax or torch")
    sides = []
    real = cost.subprocess.run
    monkeypatch.setattr(cost.subprocess, "run",
                        lambda command, **k: sides.append(command[3:5]) or real(command, **k))
    times = cost.measure([name], rounds=2)
    assert sides == [[name, "alone"], [name, "adapter"], [name, "adapter"], [name, "alone"]]
    assert all(len(times[name][side]) == 2 for side in cost.SIDES)
    for prefix in ("", "cpu_"):  # the wall clock, the CPU time
        assert all(r[prefix + "adapter_s"] == 0 for r in times[name]["alone"])  # no adapter
        assert all(r[prefix + "adapter_s"] > 0
                   and r[prefix + "total_s"] > r[prefix + "framework_s"] > 0
                   for r in times[name]["adapter"])


def test_the_import_cost_prints_both_sides_and_their_difference(monkeypatch, capsys):
    cost = benchmark_script("import_cost")
    run = lambda total, adapter=0.0: {  # noqa: E731  (the CPU: half the wall clock)
        **{"framework_s": total - adapter, "adapter_s": adapter, "total_s": total},
        **{"cpu_framework_s": (total - adapter) / 2, "cpu_adapter_s": adapter / 2,
           "cpu_total_s": total / 2}}
    times = {"torch": {"alone": [run(2.0), run(4.0), run(3.0)],
                       "adapter": [run(2.5, 0.1), run(4.1, 0.2), run(3.0, 0.1)]}}
    row = cost.summary(times)["torch"]
    assert row["alone"] == {"median": 3.0, "min": 2.0, "max": 4.0}
    assert row["adapter"] == {"median": 3.0, "min": 2.5, "max": 4.1}
    assert row["difference"]["median"] == pytest.approx(0.1)  # of the per-round differences
    assert (row["difference"]["min"], row["difference"]["max"]) == pytest.approx((0.0, 0.5))
    assert row["in_process"]["median"] == 0.1
    assert cost.summary(times, "cpu")["torch"]["alone"] == {"median": 1.5, "min": 1.0, "max": 2.0}
    monkeypatch.setattr(cost, "available", lambda name: name == "torch")
    monkeypatch.setattr(cost, "measure", lambda names, rounds: {n: times[n] for n in names})
    cost.main(["--rounds", "3"])
    out = capsys.readouterr().out
    assert "alone" in out and "adapter" in out and "difference" in out
    (line,) = [l for l in out.splitlines() if l.startswith("torch")]
    assert "3.00 (2.00-4.00)" in line and "3.00 (2.50-4.10)" in line and "+0.10" in line
    cost.main(["--rounds", "3", "--json", "--clock", "cpu"])
    row = json.loads(capsys.readouterr().out)["torch"]
    assert (row["rounds"], row["clock"], row["alone"]["median"]) == (3, "cpu", 1.5)
