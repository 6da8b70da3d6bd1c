"""A stand-in for XLA's side of the FFI: call frames built in Python, as XLA builds them.

``FakeCallFrame`` lays out operands, results and attributes in the structs of
``pycudnnrnn.jax.xla_ffi`` over NumPy arrays, with an API table whose entries
(``XLA_FFI_Stream_Get``, ``XLA_FFI_DeviceOrdinal_Get``, ``XLA_FFI_Error_Create``,
``_GetMessage`` and ``_Destroy``, ``XLA_FFI_DeviceMemory_Allocate`` and ``_Free``) are
Python callbacks that record what the handler asked. An entry can be made to fail
(``fail=``): it then returns an error of XLA's kind, which its caller owns and must
destroy, once. It lets CI run a handler without XLA — the CUDA one on the stand-in GPU
of ``fake_cuda`` — and see exactly what it did with the frame.

Device memory is XLA's allocator as the stand-in GPU plays it: blocks of a stand-in
pool of its own (counted as ``COUNTS["xla_alloc"]``, not as CuPy's ``pool_alloc``),
poison when handed out, aligned to the 16 bytes XLA promises and no more; a free
poisons the block in the order of the call's stream and hands it to the next request
there at once (XLA's allocator serves one stream's work in order). A free of memory
not allocated, or freed already, or of another size, is refused (an XLA error).
"""

import ctypes

import numpy as np

from pycudnnrnn.jax import xla_ffi
from pycudnnrnn.jax.xla_ffi import AttrType, DataType

_DATA_TYPES = {np.dtype(np.float16): DataType.F16, np.dtype(np.float32): DataType.F32,
               np.dtype(np.float64): DataType.F64, np.dtype(np.int32): DataType.S32,
               np.dtype(np.int64): DataType.S64, np.dtype(np.uint8): DataType.U8}


_XLA_POOL = []


def _xla_pool():
    """XLA's device memory on the stand-in GPU: one pool of its own, shared by every
    call (as XLA's allocator is), made at first use."""
    if not _XLA_POOL:
        import fake_cuda
        _XLA_POOL.append(fake_cuda.FakeMemoryPool("xla_alloc"))
    return _XLA_POOL[0]


def _data_type(dtype):
    dtype = np.dtype(dtype)
    if dtype.name == "bfloat16":
        return DataType.BF16
    return _DATA_TYPES[dtype]


class FakeCallFrame:
    """An ``XLA_FFI_CallFrame`` over `operands` and `results` (arrays the caller keeps).

    Attributes
    ----------
    frame : XLA_FFI_CallFrame
        Pass ``ctypes.pointer(frame)`` to a handler.
    errors : list of (message, code)
        What the handler handed to ``XLA_FFI_Error_Create``.
    asked : list of str
        The API entries the handler called, in order.
    fail : dict
        API entry name → message: that entry fails with an error of XLA's (which the
        handler must destroy). Set it before the call.
    xla_errors : dict
        Address → message of each error a failing entry returned.
    destroyed : list of int
        The errors the handler destroyed, in order (``XLA_FFI_Error_Destroy``).
    misuse : list of str
        What the handler did wrong with the API (``call`` asserts there was nothing).
    allocations, frees : list of (address, size)
        What ``XLA_FFI_DeviceMemory_Allocate`` handed out, and what ``_Free`` took back.
    live : dict
        Address → size of the allocations not freed yet.
    """

    CTX = 0xC7C7  # the frame's XLA_FFI_ExecutionContext*

    ERROR = 0xE770  # the "XLA_FFI_Error*" our Error_Create returns (XLA's to free, not ours)

    def __init__(self, operands, results, attributes, stream=0x5757, device_ordinal=0,
                 metadata=False, fail=None):
        self.errors, self.asked, self._keep = [], [], []
        self.fail, self.xla_errors, self.destroyed, self.misuse = dict(fail or {}), {}, [], []
        self.stream, self.device_ordinal = stream, device_ordinal
        self.allocations, self.frees, self.live, self._blocks = [], [], {}, {}
        args = self._list(xla_ffi.XLA_FFI_Args, [self._buffer(a) for a in operands])
        rets = self._list(xla_ffi.XLA_FFI_Rets, [self._buffer(a) for a in results])
        self.api = xla_ffi.XLA_FFI_Api(
            struct_size=ctypes.sizeof(xla_ffi.XLA_FFI_Api),
            XLA_FFI_Error_Create=xla_ffi.ERROR_CREATE(self._error_create),
            XLA_FFI_Error_GetMessage=xla_ffi.ERROR_GET_MESSAGE(self._error_get_message),
            XLA_FFI_Error_Destroy=xla_ffi.ERROR_DESTROY(self._error_destroy),
            XLA_FFI_Stream_Get=xla_ffi.STREAM_GET(self._stream_get),
            XLA_FFI_DeviceMemory_Allocate=xla_ffi.DEVICE_MEMORY_ALLOCATE(self._allocate),
            XLA_FFI_DeviceMemory_Free=xla_ffi.DEVICE_MEMORY_FREE(self._free),
            XLA_FFI_DeviceOrdinal_Get=xla_ffi.DEVICE_ORDINAL_GET(self._device_ordinal_get))
        self.metadata = xla_ffi.XLA_FFI_Metadata(ctypes.sizeof(xla_ffi.XLA_FFI_Metadata))
        extension = None
        if metadata:
            self._extension = xla_ffi.XLA_FFI_Metadata_Extension(
                xla_ffi.XLA_FFI_Extension_Base(ctypes.sizeof(xla_ffi.XLA_FFI_Metadata_Extension),
                                               xla_ffi.ExtensionType.METADATA, None),
                ctypes.pointer(self.metadata))
            extension = ctypes.cast(ctypes.pointer(self._extension),
                                    ctypes.POINTER(xla_ffi.XLA_FFI_Extension_Base))
        self.frame = xla_ffi.XLA_FFI_CallFrame(
            struct_size=ctypes.sizeof(xla_ffi.XLA_FFI_CallFrame), extension_start=extension,
            api=ctypes.pointer(self.api), ctx=self.CTX, stage=xla_ffi.ExecutionStage.EXECUTE,
            args=args, rets=rets, attrs=self._attributes(attributes))

    def _buffer(self, array):
        dims = (ctypes.c_int64 * max(array.ndim, 1))(*array.shape)
        buffer = xla_ffi.XLA_FFI_Buffer(ctypes.sizeof(xla_ffi.XLA_FFI_Buffer), None,
                                        _data_type(array.dtype), array.ctypes.data, array.ndim,
                                        dims)
        self._keep += [array, dims, buffer]
        return ctypes.addressof(buffer)

    def _list(self, struct, addresses):
        n = len(addresses)
        types = (ctypes.c_int * n)(*[xla_ffi.BUFFER] * n)
        pointers = (ctypes.c_void_p * n)(*addresses)
        self._keep += [types, pointers]
        return struct(ctypes.sizeof(struct), None, n, types, pointers)

    def _span(self, text: str):
        data = ctypes.create_string_buffer(text.encode())
        span = xla_ffi.XLA_FFI_ByteSpan(ctypes.addressof(data), len(text))
        self._keep += [data, span]
        return span

    def _attributes(self, attributes):
        # XLA sorts attributes by name; the handler must not depend on the order anyway.
        items = sorted(attributes.items())
        n = len(items)
        types, names = (ctypes.c_int * n)(), (ctypes.POINTER(xla_ffi.XLA_FFI_ByteSpan) * n)()
        values = (ctypes.c_void_p * n)()
        for i, (name, value) in enumerate(items):
            names[i] = ctypes.pointer(self._span(name))
            if isinstance(value, str):
                types[i], values[i] = AttrType.STRING, ctypes.addressof(self._span(value))
                continue
            if isinstance(value, (bool, np.bool_)):
                kind, ctype = DataType.PRED, ctypes.c_bool
            elif isinstance(value, (int, np.integer)):
                kind, ctype = DataType.S64, ctypes.c_int64
            else:
                kind, ctype = DataType.F64, ctypes.c_double
            cell = ctype(value)
            scalar = xla_ffi.XLA_FFI_Scalar(kind, ctypes.addressof(cell))
            self._keep += [cell, scalar]
            types[i], values[i] = AttrType.SCALAR, ctypes.addressof(scalar)
        self._keep += [types, names, values]
        return xla_ffi.XLA_FFI_Attrs(ctypes.sizeof(xla_ffi.XLA_FFI_Attrs), None, n,
                                     types, names, values)

    def _error_create(self, args):
        self.asked.append("XLA_FFI_Error_Create")
        self.errors.append((args.contents.message.decode(), args.contents.errc))
        return self.ERROR

    def _xla_error(self, message):
        """A new error of XLA's: its address is that of its NUL-terminated message."""
        text = ctypes.create_string_buffer(message.encode())
        self._keep.append(text)
        self.xla_errors[ctypes.addressof(text)] = message
        return ctypes.addressof(text)

    def _entry(self, name, args):
        """Record a call of API entry `name` (and any misuse: ctypes would swallow an
        assertion in a callback); the error it fails with (see ``fail``)."""
        self.asked.append(name)
        args = args.contents
        if args.struct_size < ctypes.sizeof(args):  # XLA refuses a short struct
            self.misuse.append(f"{name}: struct_size {args.struct_size}")
        if hasattr(args, "ctx") and args.ctx != self.CTX:
            self.misuse.append(f"{name}: ctx {args.ctx}, not the call frame's")
        return self._xla_error(self.fail[name]) if name in self.fail else None

    def _live_error(self, name, error):
        if error not in self.xla_errors or error in self.destroyed:
            self.misuse.append(f"{name}: {error} is no live error of XLA's")
            return False
        return True

    def _error_get_message(self, args):
        self._entry("XLA_FFI_Error_GetMessage", args)
        if self._live_error("XLA_FFI_Error_GetMessage", args.contents.error):
            args.contents.message = ctypes.cast(args.contents.error, ctypes.c_char_p)

    def _error_destroy(self, args):
        self._entry("XLA_FFI_Error_Destroy", args)
        self._live_error("XLA_FFI_Error_Destroy", args.contents.error)
        self.destroyed.append(args.contents.error)

    def _stream_get(self, args):
        error = self._entry("XLA_FFI_Stream_Get", args)
        if error is None:
            args.contents.stream = self.stream
        return error

    def _device_ordinal_get(self, args):
        error = self._entry("XLA_FFI_DeviceOrdinal_Get", args)
        if error is None:
            args.contents.device_ordinal = self.device_ordinal
        return error

    XLA_ALIGNMENT = 16  # the most XLA_FFI_DeviceMemory_Allocate accepts, and promises

    def _allocate(self, args):
        error = self._entry("XLA_FFI_DeviceMemory_Allocate", args)
        args = args.contents
        size, alignment = args.size, args.alignment
        if error is None and (alignment & (alignment - 1) or
                              not 0 < alignment <= self.XLA_ALIGNMENT):
            error = self._xla_error(f"Unsupported alignment: {alignment}")  # as XLA says
        if error is not None:
            return error
        pool = _xla_pool()
        block = pool.take(size + 256)  # poison, fresh or freed
        base = block.ctypes.data
        assert base % self.XLA_ALIGNMENT == 0
        address = base + (self.XLA_ALIGNMENT - base) % 256  # 16-aligned, not 32-aligned
        self._blocks[address] = (pool, block)
        self.live[address] = size
        self.allocations.append((address, size))
        args.data = address
        return None

    def _free(self, args):
        error = self._entry("XLA_FFI_DeviceMemory_Free", args)
        address, size = args.contents.data or 0, args.contents.size
        allocated = self.live.get(address)
        if error is None and allocated != size:
            why = f"allocated with {allocated} bytes" if allocated is not None else \
                "freed already" if address in self._blocks else "never allocated"
            self.misuse.append(f"XLA_FFI_DeviceMemory_Free: {address:#x} ({size} bytes) "
                               f"{why}")
            error = self._xla_error(f"cannot free {address:#x} ({size} bytes): {why}")
        if error is not None:
            return error
        del self.live[address]
        self.frees.append((address, size))
        pool, block = self._blocks[address]
        pool.give_back(block, self.stream)  # poisoned after the work queued on our stream
        return None

    def call(self, handler):
        """Run `handler` on this frame; what it returned (None, or ``ERROR``).

        On the stand-in GPU, the work the handler queued then runs, as XLA waits for its
        stream before the host reads the results. Asserts that the handler used the API
        rightly and gave back all the device memory it took (``misuse``, ``live``)."""
        result = handler(ctypes.pointer(self.frame))
        import fake_cuda
        fake_cuda.synchronize_all()
        assert not self.misuse, self.misuse
        assert not self.live, f"XLA memory the call did not free: {self.live}"
        return result
