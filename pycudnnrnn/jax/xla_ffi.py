"""ctypes mirror of XLA's FFI C API (``xla/ffi/api/c_api.h``), and reading a call frame.

XLA calls an FFI handler, a C function ``XLA_FFI_Error* handler(XLA_FFI_CallFrame*)``,
with the operands, results and attributes of one custom call. ctypes can make such a
function from Python (``HANDLER``), so the project needs no compiled code to be a
native XLA operation: ``pycudnnrnn.jax`` registers the handlers of
``pycudnnrnn.jax.targets`` with ``jax.ffi.register_ffi_target``.

Each structure below sits under the C declaration it mirrors, from the header jaxlib
0.10.2 ships (``jaxlib/include/xla/ffi/api/c_api.h``, FFI API 0.3). The header only ever
appends fields (a struct's ``struct_size`` says how many the other side knows), so a
handler that reads the fields of an older version works with newer XLAs; we declare
``API_VERSION`` (0, 1), the oldest layout of everything read here, and check
``struct_size`` before using a later entry of the API table.

This module knows nothing about JAX, NumPy or cuDNN: it turns a call frame into Python
values (``Buffer``, attribute dict, stream, device), lends XLA's device memory for one
call (``Scratch``) and turns Python errors into XLA errors, and XLA's into Python's.
"""

from __future__ import annotations

import ctypes
import enum
import traceback
import typing

#: FFI API version our handlers answer at the metadata stage (see the module docstring).
API_VERSION = (0, 1)


# typedef enum { XLA_FFI_Extension_Metadata = 1 } XLA_FFI_Extension_Type;
class ExtensionType(enum.IntEnum):
    METADATA = 1


# typedef enum { XLA_FFI_Error_Code_OK = 0, ..., XLA_FFI_Error_Code_INVALID_ARGUMENT = 3,
#                ..., XLA_FFI_Error_Code_INTERNAL = 13, ... } XLA_FFI_Error_Code;
class ErrorCode(enum.IntEnum):
    OK = 0
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    UNIMPLEMENTED = 12
    INTERNAL = 13


# typedef enum { XLA_FFI_DataType_INVALID = 0, XLA_FFI_DataType_PRED = 1, ... } XLA_FFI_DataType;
class DataType(enum.IntEnum):
    INVALID = 0
    PRED = 1
    S8 = 2
    S16 = 3
    S32 = 4
    S64 = 5
    U8 = 6
    U16 = 7
    U32 = 8
    U64 = 9
    F16 = 10
    F32 = 11
    F64 = 12
    BF16 = 16


# typedef enum { XLA_FFI_ArgType_BUFFER = 1 } XLA_FFI_ArgType;  (XLA_FFI_RetType likewise)
BUFFER = 1


# typedef enum { XLA_FFI_AttrType_ARRAY = 1, XLA_FFI_AttrType_DICTIONARY = 2,
#                XLA_FFI_AttrType_SCALAR = 3, XLA_FFI_AttrType_STRING = 4 } XLA_FFI_AttrType;
class AttrType(enum.IntEnum):
    ARRAY = 1
    DICTIONARY = 2
    SCALAR = 3
    STRING = 4


# typedef enum { XLA_FFI_ExecutionStage_INSTANTIATE = 0, ..._PREPARE = 1, ..._INITIALIZE = 2,
#                ..._EXECUTE = 3 } XLA_FFI_ExecutionStage;
class ExecutionStage(enum.IntEnum):
    INSTANTIATE = 0
    PREPARE = 1
    INITIALIZE = 2
    EXECUTE = 3


# typedef struct XLA_FFI_Extension_Base {
#   size_t struct_size;
#   XLA_FFI_Extension_Type type;
#   struct XLA_FFI_Extension_Base* next;
# } XLA_FFI_Extension_Base;
class XLA_FFI_Extension_Base(ctypes.Structure):
    pass


XLA_FFI_Extension_Base._fields_ = [("struct_size", ctypes.c_size_t),
                                   ("type", ctypes.c_int),
                                   ("next", ctypes.POINTER(XLA_FFI_Extension_Base))]
_EXTENSION = ctypes.POINTER(XLA_FFI_Extension_Base)


# struct XLA_FFI_Api_Version {
#   size_t struct_size;
#   XLA_FFI_Extension_Base* extension_start;
#   int major_version;  // out
#   int minor_version;  // out
# };
class XLA_FFI_Api_Version(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("extension_start", _EXTENSION),
                ("major_version", ctypes.c_int),
                ("minor_version", ctypes.c_int)]


# struct XLA_FFI_Error_Create_Args {
#   size_t struct_size;
#   XLA_FFI_Extension_Base* extension_start;
#   const char* message;
#   XLA_FFI_Error_Code errc;
# };
class XLA_FFI_Error_Create_Args(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("extension_start", _EXTENSION),
                ("message", ctypes.c_char_p),
                ("errc", ctypes.c_int)]


# struct XLA_FFI_Error_GetMessage_Args {
#   size_t struct_size;
#   XLA_FFI_Extension_Base* extension_start;
#   XLA_FFI_Error* error;
#   const char* message;  // out
# };
class XLA_FFI_Error_GetMessage_Args(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("extension_start", _EXTENSION),
                ("error", ctypes.c_void_p),
                ("message", ctypes.c_char_p)]


# struct XLA_FFI_Error_Destroy_Args {
#   size_t struct_size;
#   XLA_FFI_Extension_Base* extension_start;
#   XLA_FFI_Error* error;
# };
class XLA_FFI_Error_Destroy_Args(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("extension_start", _EXTENSION),
                ("error", ctypes.c_void_p)]


# struct XLA_FFI_Buffer {
#   size_t struct_size;
#   XLA_FFI_Extension_Base* extension_start;
#   XLA_FFI_DataType dtype;
#   void* data;
#   int64_t rank;
#   int64_t* dims;  // length == rank
# };
class XLA_FFI_Buffer(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("extension_start", _EXTENSION),
                ("dtype", ctypes.c_int),
                ("data", ctypes.c_void_p),
                ("rank", ctypes.c_int64),
                ("dims", ctypes.POINTER(ctypes.c_int64))]


# typedef struct XLA_FFI_ByteSpan { const char* ptr; size_t len; } XLA_FFI_ByteSpan;
class XLA_FFI_ByteSpan(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p),
                ("len", ctypes.c_size_t)]


# typedef struct XLA_FFI_Scalar { XLA_FFI_DataType dtype; void* value; } XLA_FFI_Scalar;
class XLA_FFI_Scalar(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int),
                ("value", ctypes.c_void_p)]


# typedef struct XLA_FFI_Array {
#   XLA_FFI_DataType dtype; size_t size; void* data;
# } XLA_FFI_Array;
class XLA_FFI_Array(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int),
                ("size", ctypes.c_size_t),
                ("data", ctypes.c_void_p)]


# struct XLA_FFI_Args {
#   size_t struct_size;
#   XLA_FFI_Extension_Base* extension_start;
#   int64_t size;
#   XLA_FFI_ArgType* types;  // length == size
#   void** args;             // length == size
# };
class XLA_FFI_Args(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("extension_start", _EXTENSION),
                ("size", ctypes.c_int64),
                ("types", ctypes.POINTER(ctypes.c_int)),
                ("args", ctypes.POINTER(ctypes.c_void_p))]


# struct XLA_FFI_Rets {
#   size_t struct_size;
#   XLA_FFI_Extension_Base* extension_start;
#   int64_t size;
#   XLA_FFI_RetType* types;  // length == size
#   void** rets;             // length == size
# };
class XLA_FFI_Rets(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("extension_start", _EXTENSION),
                ("size", ctypes.c_int64),
                ("types", ctypes.POINTER(ctypes.c_int)),
                ("rets", ctypes.POINTER(ctypes.c_void_p))]


# struct XLA_FFI_Attrs {
#   size_t struct_size;
#   XLA_FFI_Extension_Base* extension_start;
#   int64_t size;
#   XLA_FFI_AttrType* types;   // length == size
#   XLA_FFI_ByteSpan** names;  // length == size
#   void** attrs;              // length == size
# };
class XLA_FFI_Attrs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("extension_start", _EXTENSION),
                ("size", ctypes.c_int64),
                ("types", ctypes.POINTER(ctypes.c_int)),
                ("names", ctypes.POINTER(ctypes.POINTER(XLA_FFI_ByteSpan))),
                ("attrs", ctypes.POINTER(ctypes.c_void_p))]


# struct XLA_FFI_Stream_Get_Args {
#   size_t struct_size;
#   XLA_FFI_Extension_Base* extension_start;
#   XLA_FFI_ExecutionContext* ctx;
#   void* stream;  // out
# };
class XLA_FFI_Stream_Get_Args(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("extension_start", _EXTENSION),
                ("ctx", ctypes.c_void_p),
                ("stream", ctypes.c_void_p)]


# struct XLA_FFI_DeviceMemory_Allocate_Args {
#   size_t struct_size;
#   XLA_FFI_Extension_Base* extension_start;
#
#   XLA_FFI_ExecutionContext* ctx;
#   size_t size;
#   size_t alignment;
#   void* data;  // out
# };
class XLA_FFI_DeviceMemory_Allocate_Args(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("extension_start", _EXTENSION),
                ("ctx", ctypes.c_void_p),
                ("size", ctypes.c_size_t),
                ("alignment", ctypes.c_size_t),
                ("data", ctypes.c_void_p)]


# struct XLA_FFI_DeviceMemory_Free_Args {
#   size_t struct_size;
#   XLA_FFI_Extension_Base* extension_start;
#
#   XLA_FFI_ExecutionContext* ctx;
#   size_t size;
#   void* data;
# };
class XLA_FFI_DeviceMemory_Free_Args(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("extension_start", _EXTENSION),
                ("ctx", ctypes.c_void_p),
                ("size", ctypes.c_size_t),
                ("data", ctypes.c_void_p)]


# struct XLA_FFI_DeviceOrdinal_Get_Args {
#   size_t struct_size;
#   XLA_FFI_Extension_Base* extension_start;
#   XLA_FFI_ExecutionContext* ctx;
#   int32_t device_ordinal;  // out
# };
class XLA_FFI_DeviceOrdinal_Get_Args(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("extension_start", _EXTENSION),
                ("ctx", ctypes.c_void_p),
                ("device_ordinal", ctypes.c_int32)]


# typedef struct XLA_FFI_TypeId { int64_t type_id; } XLA_FFI_TypeId;
class XLA_FFI_TypeId(ctypes.Structure):
    _fields_ = [("type_id", ctypes.c_int64)]


# struct XLA_FFI_Metadata {
#   size_t struct_size;
#   XLA_FFI_Api_Version api_version;
#   XLA_FFI_Handler_Traits traits;   // uint32_t
#   XLA_FFI_TypeId state_type_id;
# };
class XLA_FFI_Metadata(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("api_version", XLA_FFI_Api_Version),
                ("traits", ctypes.c_uint32),
                ("state_type_id", XLA_FFI_TypeId)]


# struct XLA_FFI_Metadata_Extension {
#   XLA_FFI_Extension_Base extension_base;
#   XLA_FFI_Metadata* metadata;
# };
class XLA_FFI_Metadata_Extension(ctypes.Structure):
    _fields_ = [("extension_base", XLA_FFI_Extension_Base),
                ("metadata", ctypes.POINTER(XLA_FFI_Metadata))]


# typedef XLA_FFI_Error* XLA_FFI_Error_Create(XLA_FFI_Error_Create_Args* args);
ERROR_CREATE = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(XLA_FFI_Error_Create_Args))
# typedef void XLA_FFI_Error_GetMessage(XLA_FFI_Error_GetMessage_Args* args);
ERROR_GET_MESSAGE = ctypes.CFUNCTYPE(None, ctypes.POINTER(XLA_FFI_Error_GetMessage_Args))
# typedef void XLA_FFI_Error_Destroy(XLA_FFI_Error_Destroy_Args* args);
ERROR_DESTROY = ctypes.CFUNCTYPE(None, ctypes.POINTER(XLA_FFI_Error_Destroy_Args))
# typedef XLA_FFI_Error* XLA_FFI_Stream_Get(XLA_FFI_Stream_Get_Args* args);
STREAM_GET = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(XLA_FFI_Stream_Get_Args))
# typedef XLA_FFI_Error* XLA_FFI_DeviceMemory_Allocate(XLA_FFI_DeviceMemory_Allocate_Args* args);
DEVICE_MEMORY_ALLOCATE = ctypes.CFUNCTYPE(ctypes.c_void_p,
                                          ctypes.POINTER(XLA_FFI_DeviceMemory_Allocate_Args))
# typedef XLA_FFI_Error* XLA_FFI_DeviceMemory_Free(XLA_FFI_DeviceMemory_Free_Args* args);
DEVICE_MEMORY_FREE = ctypes.CFUNCTYPE(ctypes.c_void_p,
                                      ctypes.POINTER(XLA_FFI_DeviceMemory_Free_Args))
# typedef XLA_FFI_Error* XLA_FFI_DeviceOrdinal_Get(XLA_FFI_DeviceOrdinal_Get_Args* args);
DEVICE_ORDINAL_GET = ctypes.CFUNCTYPE(ctypes.c_void_p,
                                      ctypes.POINTER(XLA_FFI_DeviceOrdinal_Get_Args))


# struct XLA_FFI_Api {
#   size_t struct_size;
#   XLA_FFI_Extension_Base* extension_start;
#   XLA_FFI_Api_Version api_version;
#   const XLA_FFI_InternalApi* internal_api;
#   XLA_FFI_Error_Create* XLA_FFI_Error_Create;
#   XLA_FFI_Error_GetMessage* XLA_FFI_Error_GetMessage;
#   XLA_FFI_Error_Destroy* XLA_FFI_Error_Destroy;
#   XLA_FFI_Handler_Register* XLA_FFI_Handler_Register;
#   XLA_FFI_Stream_Get* XLA_FFI_Stream_Get;
#   XLA_FFI_Type_Register* XLA_FFI_Type_Register;
#   XLA_FFI_ExecutionContext_Get* XLA_FFI_ExecutionContext_Get;
#   XLA_FFI_State_Set* XLA_FFI_State_Set;
#   XLA_FFI_State_Get* XLA_FFI_State_Get;
#   XLA_FFI_DeviceMemory_Allocate* XLA_FFI_DeviceMemory_Allocate;
#   XLA_FFI_DeviceMemory_Free* XLA_FFI_DeviceMemory_Free;
#   XLA_FFI_ThreadPool_Schedule* XLA_FFI_ThreadPool_Schedule;
#   XLA_FFI_ThreadPool_NumThreads* XLA_FFI_ThreadPool_NumThreads;
#   XLA_FFI_Future_Create* XLA_FFI_Future_Create;
#   XLA_FFI_Future_SetAvailable* XLA_FFI_Future_SetAvailable;
#   XLA_FFI_Future_SetError* XLA_FFI_Future_SetError;
#   XLA_FFI_RunId_Get* XLA_FFI_RunId_Get;
#   XLA_FFI_DeviceOrdinal_Get* XLA_FFI_DeviceOrdinal_Get;
# };
# Entries we never call are plain pointers: only their size matters, to keep the offsets.
class XLA_FFI_Api(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("extension_start", _EXTENSION),
                ("api_version", XLA_FFI_Api_Version),
                ("internal_api", ctypes.c_void_p),
                ("XLA_FFI_Error_Create", ERROR_CREATE),
                ("XLA_FFI_Error_GetMessage", ERROR_GET_MESSAGE),
                ("XLA_FFI_Error_Destroy", ERROR_DESTROY),
                ("XLA_FFI_Handler_Register", ctypes.c_void_p),
                ("XLA_FFI_Stream_Get", STREAM_GET),
                ("XLA_FFI_Type_Register", ctypes.c_void_p),
                ("XLA_FFI_ExecutionContext_Get", ctypes.c_void_p),
                ("XLA_FFI_State_Set", ctypes.c_void_p),
                ("XLA_FFI_State_Get", ctypes.c_void_p),
                ("XLA_FFI_DeviceMemory_Allocate", DEVICE_MEMORY_ALLOCATE),
                ("XLA_FFI_DeviceMemory_Free", DEVICE_MEMORY_FREE),
                ("XLA_FFI_ThreadPool_Schedule", ctypes.c_void_p),
                ("XLA_FFI_ThreadPool_NumThreads", ctypes.c_void_p),
                ("XLA_FFI_Future_Create", ctypes.c_void_p),
                ("XLA_FFI_Future_SetAvailable", ctypes.c_void_p),
                ("XLA_FFI_Future_SetError", ctypes.c_void_p),
                ("XLA_FFI_RunId_Get", ctypes.c_void_p),
                ("XLA_FFI_DeviceOrdinal_Get", DEVICE_ORDINAL_GET)]


# struct XLA_FFI_CallFrame {
#   size_t struct_size;
#   XLA_FFI_Extension_Base* extension_start;
#   const XLA_FFI_Api* api;
#   XLA_FFI_ExecutionContext* ctx;
#   XLA_FFI_ExecutionStage stage;
#   XLA_FFI_Args args;
#   XLA_FFI_Rets rets;
#   XLA_FFI_Attrs attrs;
#   XLA_FFI_Future* future;  // out
# };
class XLA_FFI_CallFrame(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("extension_start", _EXTENSION),
                ("api", ctypes.POINTER(XLA_FFI_Api)),
                ("ctx", ctypes.c_void_p),
                ("stage", ctypes.c_int),
                ("args", XLA_FFI_Args),
                ("rets", XLA_FFI_Rets),
                ("attrs", XLA_FFI_Attrs),
                ("future", ctypes.c_void_p)]


# typedef XLA_FFI_Error* XLA_FFI_Handler(XLA_FFI_CallFrame* call_frame);
HANDLER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(XLA_FFI_CallFrame))


# ----------------------------------------------------------------- reading a call frame

class Buffer(typing.NamedTuple):
    """One operand or result: XLA's data type, the address of its data and its shape."""

    dtype: DataType
    data: int
    shape: tuple


_SCALARS = {DataType.PRED: ctypes.c_bool, DataType.S8: ctypes.c_int8,
            DataType.S16: ctypes.c_int16, DataType.S32: ctypes.c_int32,
            DataType.S64: ctypes.c_int64, DataType.U8: ctypes.c_uint8,
            DataType.U16: ctypes.c_uint16, DataType.U32: ctypes.c_uint32,
            DataType.U64: ctypes.c_uint64, DataType.F32: ctypes.c_float,
            DataType.F64: ctypes.c_double}


_DATA_TYPES = {int(t): t for t in DataType}  # a dict lookup, not an enum call, per buffer


def _buffer(address: int) -> Buffer:
    b = XLA_FFI_Buffer.from_address(address)
    dtype = _DATA_TYPES.get(b.dtype)
    return Buffer(DataType(b.dtype) if dtype is None else dtype, b.data or 0,
                  tuple(b.dims[:b.rank]))


def buffers(call_frame) -> tuple[list[Buffer], list[Buffer]]:
    """The operands and the results of a call frame, as ``Buffer`` lists."""
    args, rets = call_frame.args, call_frame.rets
    for what, table, n in (("operand", args.types, args.size), ("result", rets.types, rets.size)):
        for i in range(n):
            if table[i] != BUFFER:
                raise TypeError(f"XLA FFI {what} {i}: expected a buffer, got type {table[i]}")
    return ([_buffer(args.args[i]) for i in range(args.size)],
            [_buffer(rets.rets[i]) for i in range(rets.size)])


_CHARS: dict = {}  # length → its ctypes char array type


def _text(span) -> str:
    """The bytes of an ``XLA_FFI_ByteSpan`` as text. A char array over them is about
    twice as fast as ``ctypes.string_at`` (a foreign call itself), at a dozen strings
    per call frame."""
    n = span.len
    chars = _CHARS.get(n)
    if chars is None:
        chars = ctypes.c_char * n
        if n <= 256:  # attribute names and values: a few short lengths
            _CHARS[n] = chars
    return chars.from_address(span.ptr).raw.decode() if n else ""


def attributes(call_frame) -> dict:
    """The call's attributes: strings as str, scalars as Python numbers (PRED as bool)."""
    attrs, result = call_frame.attrs, {}
    n = attrs.size
    for name, kind, address in zip(attrs.names[:n], attrs.types[:n], attrs.attrs[:n]):
        name = _text(name.contents)
        if kind == AttrType.STRING:
            result[name] = _text(XLA_FFI_ByteSpan.from_address(address))
        elif kind == AttrType.SCALAR:
            scalar = XLA_FFI_Scalar.from_address(address)
            ctype = _SCALARS.get(scalar.dtype)
            if ctype is None:
                raise TypeError(f"attribute {name}: unsupported scalar type {scalar.dtype}")
            result[name] = ctype.from_address(scalar.value).value
        else:
            raise TypeError(f"attribute {name}: expected a string or a scalar, got type {kind}")
    return result


def _api_has(api, field: str) -> bool:
    """Whether this XLA's API table is long enough to hold `field` (see struct_size)."""
    end = getattr(XLA_FFI_Api, field).offset + ctypes.sizeof(ctypes.c_void_p)
    return api.struct_size >= end and bool(ctypes.cast(getattr(api, field), ctypes.c_void_p).value)


def stream(call_frame) -> int:
    """XLA's stream for this call (a ``cudaStream_t`` on CUDA), from ``XLA_FFI_Stream_Get``."""
    api = call_frame.api.contents
    args = XLA_FFI_Stream_Get_Args(ctypes.sizeof(XLA_FFI_Stream_Get_Args), None,
                                   call_frame.ctx, None)
    _raise_on_error(api, api.XLA_FFI_Stream_Get(ctypes.byref(args)), "XLA_FFI_Stream_Get")
    return args.stream or 0


def device_ordinal(call_frame) -> int:
    """The device this call runs on, from ``XLA_FFI_DeviceOrdinal_Get``.

    Raises RuntimeError on an XLA too old to have that entry (FFI API < 0.2 or so).
    """
    api = call_frame.api.contents
    if not _api_has(api, "XLA_FFI_DeviceOrdinal_Get"):
        raise RuntimeError("this XLA has no XLA_FFI_DeviceOrdinal_Get; a newer jaxlib is needed")
    args = XLA_FFI_DeviceOrdinal_Get_Args(ctypes.sizeof(XLA_FFI_DeviceOrdinal_Get_Args), None,
                                          call_frame.ctx, 0)
    _raise_on_error(api, api.XLA_FFI_DeviceOrdinal_Get(ctypes.byref(args)),
                    "XLA_FFI_DeviceOrdinal_Get")
    return int(args.device_ordinal)


class Scratch:
    """Device memory from XLA's allocator for one call, all freed by ``free_all`` when
    the handler is done: XLA's own ``ScratchAllocator`` (``xla/ffi/api/ffi.h``).

    Freeing at the end of the call, with the work that uses the memory still queued on
    XLA's stream, is what that class does: its destructor frees every block as the
    handler returns, and ``XLA_FFI_DeviceMemory_Free`` (``xla/ffi/ffi_api.cc``) hands
    the block straight back to XLA's allocator, with no sync. What we rely on is what
    that design relies on: XLA gives the memory again only to work it orders after this
    call's, on its stream. So the blocks are for work queued on that stream alone.
    """

    #: The largest alignment ``XLA_FFI_DeviceMemory_Allocate`` accepts (``ffi_api.cc``).
    MAX_ALIGNMENT = 16

    def __init__(self, call_frame):
        self._api, self._ctx, self._blocks = call_frame.api.contents, call_frame.ctx, []

    def allocate(self, size: int, alignment: int = 1) -> int:
        """The address of `size` bytes aligned to `alignment` (a power of two up to
        ``MAX_ALIGNMENT``), from ``XLA_FFI_DeviceMemory_Allocate``.

        Raises RuntimeError on an XLA that has no such entry or cannot allocate.
        """
        api = self._api
        if not (_api_has(api, "XLA_FFI_DeviceMemory_Allocate") and
                _api_has(api, "XLA_FFI_DeviceMemory_Free")):
            raise RuntimeError("this XLA has no XLA_FFI_DeviceMemory_Allocate/_Free; a "
                               "newer jaxlib is needed")
        args = XLA_FFI_DeviceMemory_Allocate_Args(
            ctypes.sizeof(XLA_FFI_DeviceMemory_Allocate_Args), None, self._ctx, size,
            alignment, None)
        _raise_on_error(api, api.XLA_FFI_DeviceMemory_Allocate(ctypes.byref(args)),
                        "XLA_FFI_DeviceMemory_Allocate")
        self._blocks.append((size, args.data))
        return args.data or 0

    def free_all(self):
        """Give every block back to XLA (``XLA_FFI_DeviceMemory_Free``); a failure is
        raised once all were tried."""
        blocks, self._blocks, failure = self._blocks, [], None
        for size, data in blocks:
            args = XLA_FFI_DeviceMemory_Free_Args(
                ctypes.sizeof(XLA_FFI_DeviceMemory_Free_Args), None, self._ctx, size, data)
            try:
                _raise_on_error(self._api,
                                self._api.XLA_FFI_DeviceMemory_Free(ctypes.byref(args)),
                                "XLA_FFI_DeviceMemory_Free")
            except RuntimeError as exc:
                failure = failure or exc
        if failure is not None:
            raise failure


def _raise_on_error(api, error, function):
    """A RuntimeError with XLA's message if an API call returned an ``XLA_FFI_Error*``.

    The caller owns such an error: its message is read, then it is destroyed, as the
    header's own helpers do (``xla/ffi/api/api.h``: ``GetErrorMessage``, then
    ``DestroyError``); the message lives in the error, so it is copied first.
    """
    if not error:
        return
    message = None
    try:
        if _api_has(api, "XLA_FFI_Error_GetMessage"):
            args = XLA_FFI_Error_GetMessage_Args(
                ctypes.sizeof(XLA_FFI_Error_GetMessage_Args), None, error, None)
            api.XLA_FFI_Error_GetMessage(ctypes.byref(args))
            message = args.message.decode("utf-8", "replace") if args.message else None
    finally:
        if _api_has(api, "XLA_FFI_Error_Destroy"):
            api.XLA_FFI_Error_Destroy(ctypes.byref(XLA_FFI_Error_Destroy_Args(
                ctypes.sizeof(XLA_FFI_Error_Destroy_Args), None, error)))
    raise RuntimeError(f"{function} failed" + (f": {message}" if message else ""))


def answer_metadata(call_frame) -> bool:
    """Fill in our API version if this call is XLA's metadata query; say whether it was."""
    extension = call_frame.extension_start
    if not extension or extension.contents.type != ExtensionType.METADATA:
        return False
    metadata = ctypes.cast(extension, ctypes.POINTER(XLA_FFI_Metadata_Extension)) \
        .contents.metadata.contents
    metadata.api_version.major_version, metadata.api_version.minor_version = API_VERSION
    metadata.traits = 0  # not marked command-buffer compatible: the CUDA path may sync
    return True


def error(call_frame, message: str, code: ErrorCode = ErrorCode.INTERNAL) -> int:
    """An ``XLA_FFI_Error*`` carrying `message` (XLA owns and frees it)."""
    api = call_frame.api.contents
    args = XLA_FFI_Error_Create_Args(ctypes.sizeof(XLA_FFI_Error_Create_Args), None,
                                     message.encode("utf-8", "replace"), int(code))
    return api.XLA_FFI_Error_Create(ctypes.byref(args))


def make_handler(execute):
    """A ``HANDLER`` calling ``execute(call_frame)`` at XLA's execute stage.

    The metadata query is answered; other stages do nothing. Any exception becomes an
    XLA error whose message is ``"<ExceptionType>: <message>"`` (JAX raises it in Python
    as an ``XlaRuntimeError``): a failing handler never crashes the process or hangs it.
    The returned object must be kept alive as long as XLA may call it.
    """
    def handler(frame_pointer):
        call_frame = frame_pointer.contents
        try:
            if answer_metadata(call_frame):
                return None
            if call_frame.stage != ExecutionStage.EXECUTE:
                return None
            execute(call_frame)
            return None
        except BaseException as exc:  # noqa: BLE001: even Ctrl-C must become an XLA error,
            # or ctypes would print it and report success over unwritten results
            bad_input = isinstance(exc, (ValueError, TypeError))
            code = ErrorCode.INVALID_ARGUMENT if bad_input else ErrorCode.INTERNAL
            detail = "" if bad_input else "\n" + "".join(traceback.format_exception(exc)[-3:])
            try:
                return error(call_frame, f"{type(exc).__name__}: {exc}{detail}", code)
            except BaseException:  # noqa: BLE001: no way left to tell XLA; tell the user
                traceback.print_exc()
                return None
    return HANDLER(handler)
