"""The drop-in LSTM under DistributedDataParallel and FSDP2: 2 CPU processes (gloo).

DDP equals one process on the whole batch; FSDP2 (``fully_shard``) trains as it trains
``torch.nn.LSTM``, and its sharded state dict is saved and loaded by
``torch.distributed.checkpoint``.
"""

import datetime
import gc
import os
import socket
import time

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import pycudnnrnn.torch as prt  # noqa: E402

WORLD, BATCH, T, I, H = 2, 6, 5, 3, 4
STEPS = 3
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


def _spawn(worker, *args):
    import torch.multiprocessing as mp
    context = mp.start_processes(worker, args=(_free_port(), *args), nprocs=WORLD, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    while not context.join(timeout=5):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"workers did not finish in {TIMEOUT_S} s")


class _Sharded(torch.nn.Module):
    """An LSTM (ours or torch.nn's) and a head, for FSDP2."""

    def __init__(self, lstm):
        super().__init__()
        torch.manual_seed(0)  # the same weights in every process, and for either LSTM
        self.rnn = lstm(I, H, num_layers=2, batch_first=True, dtype=torch.float64)
        self.head = torch.nn.Linear(H, 1, dtype=torch.float64)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


def _fully_sharded(lstm, mesh):
    from torch.distributed.fsdp import fully_shard
    model = _Sharded(lstm)
    fully_shard(model.rnn, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _fsdp_worker(rank, port, folder):
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    warnings.simplefilter("ignore")  # FSDP2's note on modules that return views
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))
    try:
        _fsdp_steps(rank, folder, dcp, init_device_mesh)
    finally:
        # FSDP2's hooks keep its modules, and with them the process group, in reference
        # cycles (with torch.nn's LSTM too): collected here, not at interpreter exit, where
        # gloo's threads abort now and then ("terminate called without an active exception").
        gc.collect()
        dist.destroy_process_group()


def _fsdp_steps(rank, folder, dcp, init_device_mesh):
    """The training, checkpoint and gathering of the FSDP2 test, on one rank."""
    mesh = init_device_mesh("cpu", (WORLD,))
    x, y = _data()
    shard = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)
    trained = {}
    for name, lstm in (("ours", prt.LSTM), ("torch.nn", torch.nn.LSTM)):
        model = _fully_sharded(lstm, mesh)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        for _ in range(STEPS):
            optimizer.zero_grad()
            (model(x[shard]) - y[shard]).square().mean().backward()
            optimizer.step()
        trained[name] = model
    dcp.save(trained["ours"].state_dict(), checkpoint_id=os.path.join(folder, "ckpt"))
    loaded = _fully_sharded(prt.LSTM, mesh)
    state = loaded.state_dict()
    dcp.load(state, checkpoint_id=os.path.join(folder, "ckpt"))
    loaded.load_state_dict(state)
    trained["loaded"] = loaded
    full = {name: {k: v.full_tensor() for k, v in model.state_dict().items()}
            for name, model in trained.items()}
    if rank == 0:
        torch.save(full, os.path.join(folder, "weights.pt"))
    dist.barrier()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_ddp_gradients_equal_one_process_on_the_whole_batch(tmp_path):
    path = str(tmp_path / "grads.pt")
    _spawn(_worker, path)
    distributed = torch.load(path)

    model = _model()
    x, y = _data()
    (model(x) - y).square().mean().backward()
    expected = {n: p.grad for n, p in model.named_parameters()}
    assert list(distributed) == list(expected)  # torch.nn's names, views of one buffer
    assert list(expected)[:2] == ["rnn.weight_ih_l0", "rnn.weight_hh_l0"]
    for name in expected:
        torch.testing.assert_close(distributed[name], expected[name], rtol=1e-12, atol=1e-14)


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_fsdp2_trains_as_it_trains_torch_nn_and_its_checkpoint_loads(tmp_path):
    """fully_shard over the drop-in failed at the first step ("aten.copy_.default got mixed
    torch.Tensor and DTensor"): the module re-pointed FSDP2's weights into its buffer."""
    pytest.importorskip("torch.distributed.fsdp")
    _spawn(_fsdp_worker, str(tmp_path))
    full = torch.load(str(tmp_path / "weights.pt"))
    ours, theirs, loaded = full["ours"], full["torch.nn"], full["loaded"]
    assert list(ours) == list(theirs) and list(ours)[0] == "rnn.weight_ih_l0"
    initial = _Sharded(prt.LSTM).state_dict()
    assert any(not torch.equal(ours[k], initial[k]) for k in ours)  # it trained
    for name in theirs:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-12, atol=1e-14)
        assert torch.equal(loaded[name], ours[name]), name
