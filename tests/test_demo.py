"""`make demo`'s module runs and its checks pass (and would fail on a wrong gradient)."""

import numpy as np

from pycudnnrnn import demo


def test_demo_passes(capsys):
    assert demo.main() == 0
    out = capsys.readouterr().out
    assert "all checks passed" in out and "d/dparams" in out


def test_demo_detects_a_wrong_gradient(monkeypatch):
    real = demo.api.backprop

    def corrupted(*args, **kwargs):
        grads = list(real(*args, **kwargs))
        grads[3] = grads[3] * 1.01
        return tuple(grads)

    monkeypatch.setattr(demo.api, "backprop", corrupted)
    assert demo.main() == 1
