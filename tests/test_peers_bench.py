"""benchmarks/peers.py, the CPU comparison with each framework's own RNN: its rows, its
arithmetic, and one real row timed in two processes; benchmarks/compile_floor.py, the
floor under its torch.compile rows."""

import importlib.util
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
