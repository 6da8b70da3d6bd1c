"""The stand-in GPU itself: its weight-slot table is cuDNN's, its counters count."""

import json
import os

import numpy as np
import pytest

import fake_cuda
from conftest import benchmark_script
from pycudnnrnn.checks import make_config

RECORDED = os.path.join(os.path.dirname(__file__), "data", "gpu-layout.json")


def _recorded():
    with open(RECORDED) as f:
        return json.load(f)


@pytest.mark.parametrize("entry", _recorded(), ids=lambda e: "-".join(
    str(v) for k, v in e["config"].items() if k in ("rnn_mode", "num_proj", "direction",
                                                     "input_mode")))
def test_weight_slots_are_those_cudnn_reported_on_an_h200(entry):
    """cuDNN 9.19's table, recorded by `make gpu-check` (2026-11-30), for all 20 configs."""
    c = entry["config"]
    config = make_config(rnn_mode=c["rnn_mode"], num_layers=c["num_layers"],
                         num_units=c["num_units"], input_size=c["input_size"],
                         input_mode=c["input_mode"], direction=c["direction"],
                         num_proj=c["num_proj"])
    ours = sorted([s.pseudo_layer, s.lin_layer_id, s.kind, s.offset, int(np.prod(s.shape))]
                  for s in fake_cuda.weight_slots(config))
    assert ours == sorted(entry["cudnn"])
    itemsize = np.dtype(c["dtype"]).itemsize
    assert fake_cuda.weight_space_elements(config) * itemsize == entry["cudnn_bytes"]


def test_counters_see_transfers_and_syncs():
    cp = fake_cuda.FakeCupy()
    fake_cuda.reset_counts()
    a = cp.asarray(np.arange(4.0))                 # host → device
    b = cp.asarray(a)                              # device → device: not counted
    b[...] = np.ones(4)                            # host → device
    cp.asnumpy(b)                                  # device → host, sync
    bool(a[0] > 0)                                 # a scalar read: device → host, sync
    cp.cuda.get_current_stream().synchronize()     # sync
    assert fake_cuda.COUNTS["host_to_device"] == 2
    assert fake_cuda.COUNTS["device_to_host"] == 2
    assert fake_cuda.COUNTS["sync"] == 3


def test_benchmark_helpers_report_median_and_quartiles():
    bench = benchmark_script("gpu_bench")  # imports without a GPU; its GPU parts run in gpu-check
    calls = []
    rows = bench.interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                             rounds=3, calls=2)
    assert calls == ["a", "a", "b", "b"] * 3  # interleaved rounds
    assert set(rows) == {"a", "b"} and all(q1 <= m <= q3 for m, q1, q3 in rows.values())
    assert bench.format_rows("t", {"a": (2.0, 1.0, 3.0)}).splitlines()[1].split()[:3] == \
        ["a", "2.0", "us"]


def test_host_cost_benchmark_runs_on_the_stand_in(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["gpu_host_bench.py", "--rounds", "2"])
    benchmark_script("gpu_host_bench").main()
    out = capsys.readouterr().out
    assert "forward plan" in out and "fwd+bwd functional" in out
