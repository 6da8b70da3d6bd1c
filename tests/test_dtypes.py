"""float16, bfloat16 and float32 agree with float64.

All are computed from the same (rounded) inputs as the float64 reference, so what is
compared is arithmetic error alone. float32 arithmetic (unit roundoff 6e-8) through a
few dozen dependent operations stays below 1e-5 relative; float16 results are float32
computations rounded once to float16 (unit roundoff 4.9e-4), hence 2e-3 of the
array's scale; bfloat16 results are float32's rounded once to bfloat16, within its unit
roundoff 2⁻⁸ of each value (it has float32's exponent range, so no scale is needed).
"""

import ml_dtypes
import numpy as np
import pytest

from conftest import make_case

BF16 = ml_dtypes.bfloat16
TOLERANCE = {np.float32: dict(rtol=1e-5, scale=1e-6), np.float16: dict(rtol=2e-3, scale=2e-3),
             BF16: dict(rtol=2.0 ** -8 + 2e-5, scale=2e-6)}


def _close(actual, expected, dtype):
    tol = TOLERANCE[dtype]
    atol = tol["scale"] * max(1.0, float(np.abs(expected).max(initial=0)))
    np.testing.assert_allclose(actual.astype(np.float64), expected, rtol=tol["rtol"], atol=atol)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16])
@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
@pytest.mark.parametrize("time_major", [True, False])
def test_low_precision_agrees_with_float64(dtype, mode, time_major):
    low = make_case(mode, "bidirectional", num_layers=2, lengths="zero", T=6, B=3,
                    num_proj=2 if mode == "lstm" else 0, dtype=dtype, time_major=time_major)
    high = make_case(mode, "bidirectional", num_layers=2, lengths="zero", T=6, B=3,
                     num_proj=2 if mode == "lstm" else 0, time_major=time_major)
    for name in ("input", "input_h", "input_c", "params"):
        value = getattr(low, name)
        setattr(high, name, None if value is None else value.astype(np.float64))
    fwd_low, fwd_high = low.forward(), high.forward()
    for a, b in zip(fwd_low[:3], fwd_high[:3]):
        assert a.dtype == dtype
        _close(a, b, dtype)
    rng = np.random.default_rng(0)
    seeds = [rng.standard_normal(a.shape) for a in fwd_high[:3]]
    grads_low = low.backprop(fwd_low, *(s.astype(dtype) for s in seeds))
    grads_high = high.backprop(fwd_high, *(s.astype(dtype).astype(np.float64) for s in seeds))
    for a, b in zip(grads_low, grads_high):
        assert a.dtype == dtype
        _close(a, b, dtype)


@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_16_bit_reserve_space_holds_float32(dtype):
    case = make_case("lstm", num_layers=2, dtype=dtype)
    reserve16 = case.forward()[3]
    case32 = make_case("lstm", num_layers=2, dtype=np.float32)
    assert reserve16.nbytes == case32.forward()[3].nbytes
