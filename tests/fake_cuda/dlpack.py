"""DLPack: another library's arrays on the stand-in GPU, and CuPy's import of them."""

from .arrays import FakeDeviceArray


class FakeFrameworkArray:
    """Another library's array on the stand-in GPU, taken in through DLPack."""

    def __init__(self, array):
        self.array = array

    def __dlpack_device__(self):
        return (2, self.array.device.id)

    def __dlpack__(self, stream=None):
        raise AssertionError("the stand-in imports it through FakeCupy.from_dlpack")

    @property
    def dtype(self):
        return self.array.dtype

    def view(self, dtype):
        """A view as another dtype of the same size, as PyTorch's and JAX's ``view``."""
        return FakeFrameworkArray(self.array.view(dtype))


def import_array(a):
    """``cupy.from_dlpack(a)``: a fresh view of `a`'s memory, as CuPy's import makes."""
    if isinstance(a, FakeFrameworkArray):
        return a.array.view(FakeDeviceArray)
    raise AssertionError("the fake GPU only takes FakeDeviceArray or FakeFrameworkArray")
