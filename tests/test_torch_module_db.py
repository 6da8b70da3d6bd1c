"""PyTorch's own module tests for nn.LSTM, GRU and RNN, run on the drop-ins beside torch.nn.

``torch.testing._internal.common_modules.module_db`` ships, in the torch wheel, the
constructor arguments, forward inputs (unbatched, with and without hx, batch_first,
bidirectional, proj_size, bias=False) and the bad inputs with the exception each must
raise. Every sample runs on the CPU in float32 and float64, in training and eval mode,
with and without requires_grad, through torch.nn and through pycudnnrnn.torch with the
same weights; structure, values, gradients and exception types must agree. Below them,
the behaviours of PyTorch's test_modules.py that apply (gradcheck, non-contiguous
inputs, factory kwargs, the meta device, deferred init, pickling, repr).
"""

import copy
import io
import itertools
import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")  # torch.testing._internal.common_utils imports it

from torch.testing._internal.common_modules import ModuleErrorEnum, module_db  # noqa: E402

import pycudnnrnn.torch as prt  # noqa: E402

INFOS = {info.module_cls.__name__: info for info in module_db
         if info.module_cls in (torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN)}
CONDITIONS = list(itertools.product([torch.float32, torch.float64], [True, False],
                                    [False, True]))


def _samples(kind, dtype, training, requires_grad):
    info = INFOS[kind]
    return info.module_inputs_func(info, device="cpu", dtype=dtype,
                                   requires_grad=requires_grad, training=training)


def _pair(kind, constructor, dtype):
    """torch.nn's module and ours with the same weights."""
    torch.manual_seed(0)
    theirs = getattr(torch.nn, kind)(*constructor.args, **constructor.kwargs, dtype=dtype)
    ours = getattr(prt, kind)(*constructor.args, **constructor.kwargs, dtype=dtype)
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def _tensors(value):
    """The tensors in a (nested) result, in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if hasattr(value, "data") and isinstance(value.data, torch.Tensor):  # PackedSequence
        return [value.data]
    return []


def _fresh_inputs(function_input):
    clone = lambda t: t.detach().clone().requires_grad_(t.requires_grad)
    args = [tuple(clone(t) for t in a) if isinstance(a, tuple) else clone(a)
            if isinstance(a, torch.Tensor) else a for a in function_input.args]
    return args, dict(function_input.kwargs)


def _run(module, function_input, training):
    module.train(training)
    args, kwargs = _fresh_inputs(function_input)
    outputs = _tensors(module(*args, **kwargs))
    leaves = [t for t in _tensors(args) if t.requires_grad] + list(module.parameters())
    loss = sum((o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view(o.shape)).sum()
               for o in outputs)
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return outputs, grads


@pytest.mark.parametrize("kind", sorted(INFOS))
@pytest.mark.parametrize("dtype,training,requires_grad", CONDITIONS,
                         ids=[f"{str(d)[6:]}-{'train' if t else 'eval'}-rg{r}"
                              for d, t, r in CONDITIONS])
def test_every_sample_equals_torch_nn(kind, dtype, training, requires_grad):
    tolerance = dict(rtol=1e-4, atol=2e-5) if dtype == torch.float32 else \
        dict(rtol=1e-10, atol=1e-12)
    samples = _samples(kind, dtype, training, requires_grad)
    assert samples
    for sample in samples:
        theirs, ours = _pair(kind, sample.constructor_input, dtype)
        # structure: torch.nn's parameters, state_dict, repr, class
        assert isinstance(ours, torch.nn.RNNBase)
        assert repr(ours) == repr(theirs)
        assert [(n, p.shape) for n, p in ours.named_parameters()] == \
            [(n, p.shape) for n, p in theirs.named_parameters()]
        assert list(ours.state_dict()) == list(theirs.state_dict())
        assert ours._flat_weights_names == theirs._flat_weights_names
        out_ref, grads_ref = _run(theirs, sample.forward_input, training)
        out, grads = _run(ours, sample.forward_input, training)
        assert [o.shape for o in out] == [o.shape for o in out_ref]
        for o, o_ref in zip(out, out_ref):
            assert o.dtype == o_ref.dtype
            torch.testing.assert_close(o, o_ref, **tolerance)
        for g, g_ref in zip(grads, grads_ref):
            assert (g is None) == (g_ref is None)
            if g is not None:
                torch.testing.assert_close(g, g_ref, **tolerance)


def _error_samples(kind, dtype):
    info = INFOS[kind]
    return info.module_error_inputs_func(info, device="cpu", dtype=dtype, requires_grad=False,
                                         training=True)


def _raised(function):
    try:
        function()
    except Exception as error:  # noqa: BLE001 - compared with torch.nn's below
        return error
    return None


@pytest.mark.parametrize("kind", sorted(INFOS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_every_bad_input_raises_what_torch_nn_raises(kind, dtype):
    for error in _error_samples(kind, dtype):
        sample = error.module_error_input
        c = sample.constructor_input
        built = {}

        def construct(namespace):
            built[namespace] = getattr(namespace, kind)(*c.args, **c.kwargs)
            return built[namespace]

        if error.error_on == ModuleErrorEnum.CONSTRUCTION_ERROR:
            theirs, ours = _raised(lambda: construct(torch.nn)), _raised(lambda: construct(prt))
        else:
            construct(torch.nn), construct(prt)
            f = sample.forward_input
            theirs = _raised(lambda: built[torch.nn](*f.args, **f.kwargs))
            ours = _raised(lambda: built[prt](*f.args, **f.kwargs))
        assert isinstance(theirs, error.error_type), (c, theirs)
        assert isinstance(ours, error.error_type), (c, ours)
        assert re.search(error.error_regex, str(ours)), (error.error_regex, str(ours))


# --------------------------------------------------------------------------- test_modules.py

def _first_samples(kind, dtype=torch.float64):
    """One sample without hx and one with, per class (what the costlier checks take)."""
    samples = _samples(kind, dtype, True, True)
    return [samples[0], samples[1]]


@pytest.mark.parametrize("kind", sorted(INFOS))
def test_gradcheck(kind):
    for sample in _first_samples(kind):
        _, ours = _pair(kind, sample.constructor_input, torch.float64)
        args, _ = _fresh_inputs(sample.forward_input)
        params = list(ours.parameters())
        inputs = _tensors(args)

        def function(*flat):
            data, weights = flat[:len(inputs)], flat[len(inputs):]
            names = [n for n, _ in ours.named_parameters()]
            call_args = [data[0]] + ([tuple(data[1:])] if len(data) > 2 else list(data[1:]))
            return tuple(_tensors(torch.func.functional_call(ours, dict(zip(names, weights)),
                                                             tuple(call_args))))

        assert torch.autograd.gradcheck(function, (*inputs, *params), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", sorted(INFOS))
def test_non_contiguous_inputs_give_the_same_results(kind):
    for sample in _first_samples(kind):
        _, ours = _pair(kind, sample.constructor_input, torch.float64)
        args, _ = _fresh_inputs(sample.forward_input)
        # the same values, strided: every other element of a doubled last axis
        strided = lambda t: torch.stack([t, t * 0], -1).select(-1, 0)
        spread = [tuple(strided(t) for t in a) if isinstance(a, tuple) else strided(a)
                  for a in args]
        assert not spread[0].is_contiguous()
        expected, got = _tensors(ours(*args)), _tensors(ours(*spread))
        for e, g in zip(expected, got):
            torch.testing.assert_close(g, e, rtol=0, atol=1e-15)


@pytest.mark.parametrize("kind", sorted(INFOS))
def test_factory_kwargs_and_the_meta_device(kind):
    c = _first_samples(kind)[0].constructor_input
    cls = getattr(prt, kind)
    module = cls(*c.args, **c.kwargs, dtype=torch.float64)
    assert all(p.dtype == torch.float64 for p in module.parameters())
    on_meta = cls(*c.args, **c.kwargs, device="meta")
    with torch.device("meta"):  # building under a device context, as test_device_ctx_init
        in_context = cls(*c.args, **c.kwargs)
    reference = getattr(torch.nn, kind)(*c.args, **c.kwargs)
    for m in (on_meta, in_context):
        assert all(p.device.type == "meta" for p in m.parameters())
        assert [(n, p.shape) for n, p in m.named_parameters()] == \
            [(n, p.shape) for n, p in reference.named_parameters()]


@pytest.mark.parametrize("kind", sorted(INFOS))
@pytest.mark.parametrize("bias", [True, False])
def test_deferred_init_by_to_empty_and_by_skip_init(kind, bias):
    c = _first_samples(kind)[0].constructor_input
    kwargs = dict(c.kwargs, bias=bias)
    torch.manual_seed(0)
    theirs = getattr(torch.nn, kind)(*c.args, **kwargs, dtype=torch.float64)
    x = torch.randn(3, 2, 2, dtype=torch.float64)
    expected = _tensors(theirs(x))
    deferred = getattr(prt, kind)(*c.args, **kwargs, dtype=torch.float64, device="meta")
    deferred.to_empty(device="cpu")
    deferred.reset_parameters()
    deferred.load_state_dict(theirs.state_dict())
    skipped = torch.nn.utils.skip_init(getattr(prt, kind), *c.args, **kwargs,
                                       dtype=torch.float64)
    skipped.load_state_dict(theirs.state_dict())
    for module in (deferred, skipped):
        for e, g in zip(expected, _tensors(module(x))):
            torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", sorted(INFOS))
def test_save_load_and_deepcopy_keep_the_function(kind):
    sample = _first_samples(kind)[1]
    _, ours = _pair(kind, sample.constructor_input, torch.float64)
    args, _ = _fresh_inputs(sample.forward_input)
    expected = _tensors(ours(*args))
    buffer = io.BytesIO()
    torch.save(ours, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    for other in (loaded, copy.deepcopy(ours)):
        assert repr(other) == repr(ours)
        for e, g in zip(expected, _tensors(other(*args))):
            torch.testing.assert_close(g, e, rtol=0, atol=0)
