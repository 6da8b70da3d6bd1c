"""The library's own exceptions.

``InsufficientMemoryError`` refuses a call whose estimated memory exceeds what is
available, before it allocates. A failing cuDNN call raises a ``CudnnError`` subclass chosen by the status's family
(cuDNN 9 numbers statuses by family: 1xxx not initialised, 2xxx bad parameter, 3xxx not
supported, 4xxx internal, 5xxx execution failed), so callers can catch
``CudnnNotSupportedError`` without parsing messages. cuDNN's failed device allocation
(4004) is also a ``MemoryError``: ``CudnnAllocationError``.
"""

from __future__ import annotations


class InsufficientMemoryError(MemoryError):
    """A call would allocate more memory than is available; raised before it allocates.

    Attributes
    ----------
    what : str
        The call, e.g. ``"forward"``.
    required_bytes : int
        Its estimate of the bytes it would allocate.
    available_bytes : int
        The bytes available, and `source` where that figure comes from.
    """

    def __init__(self, what: str, required_bytes: int, available_bytes: int, source: str):
        self.what, self.required_bytes = what, required_bytes
        self.available_bytes, self.source = available_bytes, source
        super().__init__(
            f"{what}: needs about {required_bytes} bytes ({_gib(required_bytes)}) for its "
            f"outputs, reserve space and scratch, but {available_bytes} bytes "
            f"({_gib(available_bytes)}) are available ({source}); use a smaller batch, "
            f"shorter sequences or a smaller network")


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2 ** 30:.3g} GiB"


class CudnnUnavailableError(RuntimeError):
    """cuDNN 9, CuPy or a GPU is missing; the message says what was tried and what to install."""


class CudnnError(RuntimeError):
    """A cuDNN call returned a status other than CUDNN_STATUS_SUCCESS.

    Attributes
    ----------
    status : int
        The ``cudnnStatus_t`` value.
    status_name : str
        Its name, e.g. ``"CUDNN_STATUS_NOT_SUPPORTED"``.
    function : str
        The cuDNN function that failed.
    detail : str
        cuDNN's own ``cudnnGetLastErrorString`` text (may be empty).
    """

    def __init__(self, status: int, status_name: str, function: str, detail: str = ""):
        self.status, self.status_name, self.function, self.detail = status, status_name, function, detail
        message = f"{function} failed with {status_name} ({status})"
        super().__init__(f"{message}: {detail}" if detail else message)


class CudnnNotInitializedError(CudnnError):
    """1xxx: cuDNN could not start (no GPU, driver or sub-library mismatch, ...)."""


class CudnnBadParamError(CudnnError):
    """2xxx: a parameter cuDNN rejected."""


class CudnnNotSupportedError(CudnnError):
    """3xxx: a configuration cuDNN does not support."""


class CudnnInternalError(CudnnError):
    """4xxx: an error inside cuDNN."""


class CudnnAllocationError(CudnnInternalError, MemoryError):
    """4004, ``CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED``: cuDNN could not
    allocate device memory. A ``MemoryError`` too, as CuPy's out-of-memory error is, so
    one ``except MemoryError`` catches every failed allocation."""


class CudnnExecutionFailedError(CudnnError):
    """5xxx: a kernel or a library cuDNN relies on failed while running."""


_FAMILIES = {1: CudnnNotInitializedError, 2: CudnnBadParamError, 3: CudnnNotSupportedError,
             4: CudnnInternalError, 5: CudnnExecutionFailedError}
_STATUSES = {4004: CudnnAllocationError}  # a class of their own, within their family's


def error_class(status: int) -> type[CudnnError]:
    """The exception class for a cuDNN status (its family is ``status // 1000``)."""
    return _STATUSES.get(status) or _FAMILIES.get(status // 1000, CudnnError)
