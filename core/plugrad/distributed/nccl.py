"""NCCL (NVIDIA's collectives library) through ctypes, for collectives between CUDA devices (docs/distributed.md).

The library is NVIDIA's `nvidia-nccl-cu13` wheel's `nvidia/nccl/lib/libnccl.so.2` (`pip install 'plugrad[nccl]'`), a
system libnccl.so.2, or the file PLUGRAD_NCCL_LIB names. It loads without a GPU (ncclGetVersion and ncclGetUniqueId
work); everything else needs CUDA devices.

UNVERIFIED HERE (no GPU on the development machine): the collectives are checked against a stand-in library
(tests/distributed/test_nccl.py) and the prototypes against the wheel's nccl.h; bench/gpu/nccl_allreduce.py runs them on GPUs.

Every call goes through `PROTOTYPES`' argtypes, so a size_t or a pointer never travels as a 32-bit C int. `cuStreamQuery`
(libcuda) is declared here too: waiting for a collective with a deadline means polling its stream, and the core may
not import the CUDA plugin.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from plugrad.distributed.errors import DistributedError
from plugrad.dtype import DType, dtypes

__all__ = ["NCCL", "NCCLError", "NCCL_DTYPES", "NCCL_OPS", "UNIQUE_ID_BYTES", "find_library", "load", "unavailable_reason"]

UNIQUE_ID_BYTES = 128  # NCCL_UNIQUE_ID_BYTES: ncclUniqueId is a struct holding this many chars


class UniqueId(ctypes.Structure):
  """ncclUniqueId, passed by value to ncclCommInitRank."""
  _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]


# ncclResult_t
SUCCESS, IN_PROGRESS = 0, 7
RESULTS = {0: "ncclSuccess", 1: "ncclUnhandledCudaError", 2: "ncclSystemError", 3: "ncclInternalError", 4: "ncclInvalidArgument",
           5: "ncclInvalidUsage", 6: "ncclRemoteError", 7: "ncclInProgress", 8: "ncclTimeout"}
# ncclDataType_t for the plugrad dtypes NCCL reduces (bool travels as uint8: max/min of 0/1 are or/and)
NCCL_DTYPES: dict[DType, int] = {dtypes.int8: 0, dtypes.uint8: 1, dtypes.bool: 1, dtypes.int32: 2, dtypes.uint32: 3, dtypes.int64: 4,
                                 dtypes.uint64: 5, dtypes.float16: 6, dtypes.float32: 7, dtypes.float64: 8, dtypes.bfloat16: 9}
UINT8 = 1  # all_gather and broadcast move bytes: any dtype goes as ncclUint8
# ncclRedOp_t by plugrad.distributed's op name ('mean' is ncclAvg, NCCL >= 2.10)
NCCL_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "mean": 4}
CUDA_ERROR_NOT_READY = 600  # cuStreamQuery: work still pending on the stream

_i32, _size, _ptr = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p
# per function, (C type as nccl.h / cuda.h spell it, ctypes type) for each parameter; all return ncclResult_t (CUresult
# for cuStreamQuery) except ncclGetErrorString. tests/distributed/test_nccl.py compiles them against the wheel's nccl.h.
PROTOTYPES: dict[str, tuple[tuple[str, Any], ...]] = {
  "ncclGetVersion": (("int *", ctypes.POINTER(_i32)),),
  "ncclGetUniqueId": (("ncclUniqueId *", ctypes.POINTER(UniqueId)),),
  "ncclCommInitRank": (("ncclComm_t *", ctypes.POINTER(_ptr)), ("int", _i32), ("ncclUniqueId", UniqueId), ("int", _i32)),
  "ncclCommDestroy": (("ncclComm_t", _ptr),),
  "ncclCommAbort": (("ncclComm_t", _ptr),),
  "ncclCommGetAsyncError": (("ncclComm_t", _ptr), ("ncclResult_t *", ctypes.POINTER(_i32))),
  "ncclAllReduce": (("const void *", _ptr), ("void *", _ptr), ("size_t", _size), ("ncclDataType_t", _i32), ("ncclRedOp_t", _i32),
                    ("ncclComm_t", _ptr), ("cudaStream_t", _ptr)),
  "ncclBroadcast": (("const void *", _ptr), ("void *", _ptr), ("size_t", _size), ("ncclDataType_t", _i32), ("int", _i32), ("ncclComm_t", _ptr),
                    ("cudaStream_t", _ptr)),
  "ncclAllGather": (("const void *", _ptr), ("void *", _ptr), ("size_t", _size), ("ncclDataType_t", _i32), ("ncclComm_t", _ptr),
                    ("cudaStream_t", _ptr)),
  "ncclGroupStart": (),
  "ncclGroupEnd": (),
  "ncclGetErrorString": (("ncclResult_t", _i32),),
}
CUDA_PROTOTYPES: dict[str, tuple[tuple[str, Any], ...]] = {"cuStreamQuery": (("CUstream", _ptr),)}


class NCCLError(DistributedError):
  """An NCCL call failed: the message names the call, NCCL's result name and its text."""
  def __init__(self, call: str, code: int, text: str = ""):
    self.call, self.code = call, code
    super().__init__(f"{call} failed: {RESULTS.get(code, f'result {code}')}" + (f" ({text})" if text else ""))


def _wheel_dirs() -> Iterator[Path]:
  """The lib folders of NVIDIA's NCCL wheels (nvidia-nccl-cu12 and -cu13 both install the namespace package nvidia.nccl)."""
  try: spec = importlib.util.find_spec("nvidia.nccl")
  except (ImportError, ValueError): spec = None
  for root in (spec.submodule_search_locations or []) if spec is not None else []: yield Path(root) / "lib"


def find_library() -> str:
  """What `load()` opens: PLUGRAD_NCCL_LIB, else the wheel's libnccl.so.2, else the loader's libnccl.so.2."""
  if path := os.environ.get("PLUGRAD_NCCL_LIB"): return path
  return next((str(p) for d in _wheel_dirs() if (p := d / "libnccl.so.2").is_file()), "libnccl.so.2")


class NCCL:
  """Typed calls into libnccl (`lib`: the CDLL, or a stand-in object with the same function names) and libcuda's
  cuStreamQuery (`cuda`, opened on first use). Each method raises NCCLError naming the call when NCCL fails."""

  def __init__(self, lib: Any, cuda: Any = None, path: str = "libnccl"):
    self.lib, self._cuda, self.path = lib, cuda, path
    if isinstance(lib, ctypes.CDLL): _declare(lib, PROTOTYPES)
    if isinstance(lib, ctypes.CDLL): lib.ncclGetErrorString.restype = ctypes.c_char_p

  def _text(self, code: int) -> str:
    try: text = self.lib.ncclGetErrorString(_i32(code))
    except Exception: return ""  # the message is a courtesy: never hide the original failure behind a second one
    return text.decode(errors="replace") if isinstance(text, bytes) else str(text or "")

  def check(self, code: Any, call: str) -> None:
    if (code := int(code)) != SUCCESS: raise NCCLError(call, code, self._text(code))

  def version(self) -> int:
    """NCCL_VERSION_CODE of the loaded library (major * 10000 + minor * 100 + patch since 2.9)."""
    v = _i32()
    self.check(self.lib.ncclGetVersion(ctypes.pointer(v)), "ncclGetVersion")
    return v.value

  def unique_id(self) -> bytes:
    uid = UniqueId()
    self.check(self.lib.ncclGetUniqueId(ctypes.pointer(uid)), "ncclGetUniqueId")
    return bytes(ctypes.string_at(ctypes.addressof(uid), UNIQUE_ID_BYTES))

  def comm_init_rank(self, nranks: int, uid: bytes, rank: int) -> int:
    """A communicator of `nranks` ranks for the current CUDA device; blocks until every rank has joined."""
    if len(uid) != UNIQUE_ID_BYTES: raise ValueError(f"an NCCL unique id is {UNIQUE_ID_BYTES} bytes, got {len(uid)}")
    comm = _ptr()
    self.check(self.lib.ncclCommInitRank(ctypes.pointer(comm), _i32(nranks), UniqueId.from_buffer_copy(uid), _i32(rank)),
               f"ncclCommInitRank(nranks={nranks}, rank={rank})")
    if not comm.value: raise NCCLError(f"ncclCommInitRank(nranks={nranks}, rank={rank})", SUCCESS, "it returned a null communicator")
    return comm.value

  def destroy(self, comm: int) -> None: self.check(self.lib.ncclCommDestroy(_ptr(comm)), "ncclCommDestroy")
  def abort(self, comm: int) -> None: self.check(self.lib.ncclCommAbort(_ptr(comm)), "ncclCommAbort")

  def async_error(self, comm: int) -> int:
    """ncclCommGetAsyncError: SUCCESS while the communicator is healthy, else the error a peer or the network caused."""
    res = _i32()
    self.check(self.lib.ncclCommGetAsyncError(_ptr(comm), ctypes.pointer(res)), "ncclCommGetAsyncError")
    return res.value

  def all_reduce(self, send: int, recv: int, count: int, dtype: int, op: int, comm: int, stream: int | None) -> None:
    self.check(self.lib.ncclAllReduce(_ptr(send), _ptr(recv), _size(count), _i32(dtype), _i32(op), _ptr(comm), _ptr(stream)),
               f"ncclAllReduce(count={count}, datatype={dtype}, op={op})")

  def broadcast(self, send: int, recv: int, count: int, dtype: int, root: int, comm: int, stream: int | None) -> None:
    self.check(self.lib.ncclBroadcast(_ptr(send), _ptr(recv), _size(count), _i32(dtype), _i32(root), _ptr(comm), _ptr(stream)),
               f"ncclBroadcast(count={count}, root={root})")

  def all_gather(self, send: int, recv: int, count: int, dtype: int, comm: int, stream: int | None) -> None:
    self.check(self.lib.ncclAllGather(_ptr(send), _ptr(recv), _size(count), _i32(dtype), _ptr(comm), _ptr(stream)),
               f"ncclAllGather(sendcount={count})")

  def group_start(self) -> None: self.check(self.lib.ncclGroupStart(), "ncclGroupStart")
  def group_end(self) -> None: self.check(self.lib.ncclGroupEnd(), "ncclGroupEnd")

  def stream_done(self, stream: int | None) -> bool:
    """Whether everything enqueued on `stream` has finished (cuStreamQuery; the stream's context need not be current)."""
    if self._cuda is None:
      self._cuda = ctypes.CDLL("libcuda.so.1")
      _declare(self._cuda, CUDA_PROTOTYPES)
    code = int(self._cuda.cuStreamQuery(_ptr(stream)))
    if code == CUDA_ERROR_NOT_READY: return False
    if code != 0: raise NCCLError("cuStreamQuery (waiting for an NCCL collective)", code, f"CUresult {code}: a kernel on the stream failed")
    return True


def _declare(lib: ctypes.CDLL, protos: dict[str, tuple[tuple[str, Any], ...]]) -> None:
  for name, params in protos.items():
    fn = getattr(lib, name)
    fn.argtypes, fn.restype = [t for _, t in params], ctypes.c_int


_LOADED: dict[str, NCCL | str] = {}  # path -> the library, or why it did not load (tried once per path)


def load(path: str | None = None) -> NCCL:
  """The NCCL library at `path` (default find_library()), opened once. Raises DistributedError with
  the loader's reason and how to install it: a DistributedError."""
  path = path or find_library()
  if (hit := _LOADED.get(path)) is None:
    try: hit = NCCL(ctypes.CDLL(path), path=path)
    except (OSError, AttributeError) as e:  # AttributeError: a library without one of the functions PROTOTYPES declares
      hit = (f"cannot load NCCL from {path!r} ({e}); install it with `pip install 'plugrad[nccl]'` (NVIDIA's nvidia-nccl-cu13 wheel) "
             "or set PLUGRAD_NCCL_LIB")
    _LOADED[path] = hit
  if isinstance(hit, str): raise DistributedError(hit)
  return hit


def unavailable_reason(path: str | None = None) -> str | None:
  """None when NCCL loads, else why not (the message load() raises)."""
  try: load(path)
  except DistributedError as e: return str(e)
  return None
