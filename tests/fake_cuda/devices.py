"""Devices: how many there are, which one is current on each thread, ``cuda.Device``.

Each thread has a current device (``Device(n)`` changes it), each device its own null
stream and current stream (``streams``), each array and stream the device it was made
on. Devices are GPUs of different kinds: cuDNN on device n asks for larger buffers than
on device 0 (``cudnn.temp_space_bytes``), so sizes taken on the wrong device show.
"""

from .state import _local

#: How many devices the stand-in has (a test may set more; ``install`` puts back 1).
DEVICES = [1]


def current_device() -> int:
    """This thread's current device (``cuda.Device(n)`` changes it)."""
    return getattr(_local, "device", 0)


class Device:
    """``with Device(n):`` makes device n current on this thread (CuPy's ``cuda.Device``)."""

    def __init__(self, id=None):
        self.id = current_device() if id is None else int(id)
        if not 0 <= self.id < DEVICES[0]:
            raise RuntimeError(f"cudaErrorInvalidDevice: device {self.id} of "
                               f"{DEVICES[0]}")
        self._before = []

    def __enter__(self):
        self._before.append(current_device())
        _local.device = self.id
        return self

    def __exit__(self, *exc):
        _local.device = self._before.pop()

    @staticmethod
    def synchronize():
        from .streams import device_synchronize  # streams sit on devices: imported late
        device_synchronize()
