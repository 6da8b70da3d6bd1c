"""The drop-in LSTM under DistributedDataParallel: 2 CPU processes (gloo) equal one process."""

import datetime
import os
import socket
import time

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import pycudnnrnn.torch as prt  # noqa: E402

WORLD, BATCH, T, I, H = 2, 6, 5, 3, 4
TIMEOUT_S = 120


class _Regressor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = prt.LSTM(I, H, num_layers=2, batch_first=True, bidirectional=True,
                            dtype=torch.float64)
        self.head = torch.nn.Linear(2 * H, 1, dtype=torch.float64)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


def _model():
    torch.manual_seed(0)  # the same initial weights in every process
    return _Regressor()


def _data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, T, I, generator=g, dtype=torch.float64)
    return x, torch.randn(BATCH, T, 1, generator=g, dtype=torch.float64)


def _worker(rank, port, path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))
    try:
        model = torch.nn.parallel.DistributedDataParallel(_model())
        x, y = _data()
        shard = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)
        # each process: the mean over its half; DDP averages the two, giving the whole mean
        (model(x[shard]) - y[shard]).square().mean().backward()
        if rank == 0:
            torch.save({n: p.grad for n, p in model.module.named_parameters()}, path)
        # PyTorch's shutdown order. Without it a gloo thread can still be releasing the
        # backward's last allreduce (it needs the GIL to drop that step's Python context)
        # while this thread, holding the GIL, destroys the process group it locks: a hang or
        # an abort at exit, about 1 run in 10 here (never a wrong gradient).
        dist.barrier()
        del model
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_ddp_gradients_equal_one_process_on_the_whole_batch(tmp_path):
    import torch.multiprocessing as mp
    path = str(tmp_path / "grads.pt")
    context = mp.start_processes(_worker, args=(_free_port(), path), nprocs=WORLD, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    while not context.join(timeout=5):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"DDP workers did not finish in {TIMEOUT_S} s")
    distributed = torch.load(path)

    model = _model()
    x, y = _data()
    (model(x) - y).square().mean().backward()
    expected = {n: p.grad for n, p in model.named_parameters()}
    assert list(distributed) == list(expected)  # torch.nn's names, views of one buffer
    assert list(expected)[:2] == ["rnn.weight_ih_l0", "rnn.weight_hh_l0"]
    for name in expected:
        torch.testing.assert_close(distributed[name], expected[name], rtol=1e-12, atol=1e-14)
