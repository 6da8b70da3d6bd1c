"""A stand-in for XLA's side of the FFI: call frames built in Python, as XLA builds them.

``FakeCallFrame`` lays out operands, results and attributes in the structs of
``pycudnnrnn.jax.xla_ffi`` over NumPy arrays, with an API table whose entries
(``XLA_FFI_Stream_Get``, ``XLA_FFI_DeviceOrdinal_Get``, ``XLA_FFI_Error_Create``,
``_GetMessage`` and ``_Destroy``) are Python callbacks that record what the handler
asked. An entry can be made to fail (``fail=``): it then returns an error of XLA's kind,
which its caller owns and must destroy, once. It lets CI run a handler without XLA — the
CUDA one on the stand-in GPU of ``fake_cuda.py`` — and see exactly what it did with the
frame.
"""

import ctypes

import numpy as np

from pycudnnrnn.jax import xla_ffi
from pycudnnrnn.jax.xla_ffi import AttrType, DataType

_DATA_TYPES = {np.dtype(np.float16): DataType.F16, np.dtype(np.float32): DataType.F32,
               np.dtype(np.float64): DataType.F64, np.dtype(np.int32): DataType.S32,
               np.dtype(np.int64): DataType.S64, np.dtype(np.uint8): DataType.U8}


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
    """

    CTX = 0xC7C7  # the frame's XLA_FFI_ExecutionContext*

    ERROR = 0xE770  # the "XLA_FFI_Error*" our Error_Create returns (XLA's to free, not ours)

    def __init__(self, operands, results, attributes, stream=0x5757, device_ordinal=0,
                 metadata=False, fail=None):
        self.errors, self.asked, self._keep = [], [], []
        self.fail, self.xla_errors, self.destroyed, self.misuse = dict(fail or {}), {}, [], []
        self.stream, self.device_ordinal = stream, device_ordinal
        args = self._list(xla_ffi.XLA_FFI_Args, [self._buffer(a) for a in operands])
        rets = self._list(xla_ffi.XLA_FFI_Rets, [self._buffer(a) for a in results])
        self.api = xla_ffi.XLA_FFI_Api(
            struct_size=ctypes.sizeof(xla_ffi.XLA_FFI_Api),
            XLA_FFI_Error_Create=xla_ffi.ERROR_CREATE(self._error_create),
            XLA_FFI_Error_GetMessage=xla_ffi.ERROR_GET_MESSAGE(self._error_get_message),
            XLA_FFI_Error_Destroy=xla_ffi.ERROR_DESTROY(self._error_destroy),
            XLA_FFI_Stream_Get=xla_ffi.STREAM_GET(self._stream_get),
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

    def call(self, handler):
        """Run `handler` on this frame; what it returned (None, or ``ERROR``).

        On the stand-in GPU, the work the handler queued then runs, as XLA waits for its
        stream before the host reads the results."""
        result = handler(ctypes.pointer(self.frame))
        import fake_cuda
        fake_cuda.synchronize_all()
        assert not self.misuse, self.misuse
        return result
