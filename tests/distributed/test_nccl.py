"""plugrad.distributed's NCCL path (core/plugrad/distributed/nccl.py, comm.py), without a GPU.

(a) The real libnccl from NVIDIA's wheel (`pip install 'plugrad[nccl]'`; skipped, saying so, without it): it loads, its
    version is the wheel's, ncclGetUniqueId gives 128 bytes, and PROTOTYPES compile against the wheel's nccl.h.
(b) A STAND-IN for libnccl (a Python object with NCCL's function names that records each call and performs the
    collective on host memory) drives comm.py's NCCL path: CPU tensors are treated as CUDA:0 (their buffers are host
    memory, so the stand-in writes the real result buffers), with a fake stream value. It checks the pointers, counts,
    datatypes, ops, roots and the communicator setup plugrad passes, for a world of one and for rank 1 of a simulated
    world of two (a fake MPI carries the unique id; the stand-in's rank 0 sends `own + 1`).
The real collectives on GPUs are UNRUN here: bench/gpu/nccl_allreduce.py runs them where GPUs exist.
"""
from __future__ import annotations

import ctypes
import importlib.util
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from plugrad import Tensor, dtypes
from plugrad.distributed import DistributedError, DistributedTimeoutError, comm, nccl
from plugrad.helpers import SettingsError

WHEEL = importlib.util.find_spec("nvidia.nccl") is not None and any((Path(p) / "lib" / "libnccl.so.2").is_file()
                                                                    for p in importlib.util.find_spec("nvidia.nccl").submodule_search_locations or [])
needs_wheel = pytest.mark.skipif(not WHEEL, reason="needs NVIDIA's NCCL wheel: pip install 'plugrad[nccl]' (nvidia-nccl-cu13, ~200 MB)")
STREAM = 0x5EED  # the fake CUDA stream every call must carry
NP = {0: np.int8, 1: np.uint8, 2: np.int32, 3: np.uint32, 4: np.int64, 5: np.uint64, 6: np.float16, 7: np.float32, 8: np.float64}


# ---------------------------------------------------------------- (a) the real library

@needs_wheel
def test_real_libnccl_loads_and_reports_the_wheels_version():
  lib = nccl.load()
  # the wheel that installed the library loaded (cu13 beside the CUDA 13 runtime plugrad-cuda uses, or an older cu12)
  dist = next((d for d in ("nvidia-nccl-cu13", "nvidia-nccl-cu12") if _has_dist(d)), None)
  version = importlib.metadata.version(dist) if dist is not None and len(list(nccl._wheel_dirs())) == 1 else None
  v = lib.version()
  assert v >= 21000, v
  if version is not None:
    major, minor, patch = (int(x) for x in version.split(".")[:3])
    assert v == major * 10000 + minor * 100 + patch, (v, version)
  uid = lib.unique_id()
  assert len(uid) == nccl.UNIQUE_ID_BYTES == 128 and any(uid)
  assert lib.unique_id() != uid  # a fresh id each call
  assert "invalid argument" in lib._text(4).lower(), lib._text(4)


def _has_dist(name: str) -> bool:
  try: importlib.metadata.version(name)
  except importlib.metadata.PackageNotFoundError: return False
  return True


def _cuda_include() -> Path | None:
  """A folder with cuda.h (cuStreamQuery's prototype): NVIDIA's runtime wheels ship it."""
  spec = importlib.util.find_spec("nvidia")
  for root in (spec.submodule_search_locations or []) if spec else []:
    for inc in sorted(Path(root).glob("*/include")):
      if (inc / "cuda.h").is_file(): return inc
  return None


# nccl.h includes the CUDA runtime headers, whose full set (crt/, from the nvcc wheel) is absent here: these stand-ins
# declare only what nccl.h's prototypes use, spelled as the runtime spells them (cudaStream_t is CUstream's struct)
_RUNTIME_STUBS = {"cuda_runtime.h": "#include <stddef.h>\n#define CUDART_VERSION 12000\n"
                                    "typedef struct CUstream_st *cudaStream_t;\ntypedef struct CUevent_st *cudaEvent_t;\n",
                  "cuda_fp16.h": "", "cuda_bf16.h": "", "cuda_fp8.h": ""}


@needs_wheel
@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc to compile the prototype check")
def test_prototypes_match_the_wheels_nccl_h(tmp_path):
  """Each PROTOTYPES entry, spelled as a function pointer type, is assigned the header's function: gcc rejects a
  parameter type or count that differs. The ctypes types' sizes are checked against the C types' too."""
  if (cuda_inc := _cuda_include()) is None: pytest.skip("no cuda.h (pip install nvidia-cuda-runtime) for cuStreamQuery's prototype")
  stubs = tmp_path / "stubs"
  stubs.mkdir()
  for name, text in _RUNTIME_STUBS.items(): (stubs / name).write_text(text)
  nccl_inc = next(Path(p) / "include" for p in importlib.util.find_spec("nvidia.nccl").submodule_search_locations or [])  # type: ignore[union-attr]
  lines = ["#include <nccl.h>", "#include <cuda.h>", "#include <assert.h>", "int main(void) {"]
  for name, params in {**nccl.PROTOTYPES, **nccl.CUDA_PROTOTYPES}.items():
    ret = "const char *" if name == "ncclGetErrorString" else "CUresult" if name.startswith("cu") else "ncclResult_t"
    args = ", ".join(c for c, _ in params) or "void"
    lines.append(f"  {{ {ret} (*f)({args}) = {name}; (void)f; }}")
    lines += [f"  _Static_assert(sizeof({c}) == {ctypes.sizeof(t)}, \"{name}: {c}\");" for c, t in params]
  lines += ["  return 0;", "}"]
  (tmp_path / "check.c").write_text("\n".join(lines) + "\n")
  out = subprocess.run(["gcc", "-Werror=incompatible-pointer-types", "-c", "-I", str(stubs), "-I", str(nccl_inc), "-I", str(cuda_inc),
                        "check.c"],
                       cwd=tmp_path, capture_output=True, text=True)
  assert out.returncode == 0, out.stderr


def test_missing_library_is_a_distributed_error(monkeypatch):
  monkeypatch.setenv("PLUGRAD_NCCL_LIB", "/nonexistent/libnccl.so.2")
  with pytest.raises(DistributedError, match=r"cannot load NCCL from '/nonexistent/libnccl.so.2'.*plugrad\[nccl\]"): nccl.load()
  assert nccl.unavailable_reason() is not None


# ---------------------------------------------------------------- (b) the stand-in

class StandIn:
  """A STAND-IN for libnccl (and libcuda's cuStreamQuery): NCCL's function names, arguments received as the ctypes
  values plugrad passes, every call recorded, the collective performed on host memory. With `nranks` 2 it simulates
  the other rank as one whose send buffer holds this rank's values + 1 (rank 0 first in rank order)."""
  UID = bytes(range(128))

  def __init__(self) -> None:
    self.calls: list[tuple[Any, ...]] = []
    self.comms: dict[int, tuple[int, int, bytes]] = {}  # handle -> (nranks, rank, uid)
    self.aborted: list[int] = []
    self.async_result = 0
    self.stream_ready = True
    self.in_group = 0
    self.made_ids = 0

  def ncclGetVersion(self, v: Any) -> int: v.contents.value = 23203; return 0
  def ncclGetUniqueId(self, uid: Any) -> int:
    ctypes.memmove(ctypes.addressof(uid.contents), self.UID, 128)
    self.calls.append(("ncclGetUniqueId",))
    self.made_ids += 1
    return 0

  def ncclCommInitRank(self, comm: Any, nranks: Any, uid: Any, rank: Any) -> int:
    handle = 0xC0 + len(self.comms)
    self.comms[handle] = (nranks.value, rank.value, bytes(uid))  # (.internal would stop at a NUL)
    comm.contents.value = handle
    self.calls.append(("ncclCommInitRank", nranks.value, bytes(uid), rank.value))
    return 0

  def ncclCommDestroy(self, comm: Any) -> int: self.calls.append(("ncclCommDestroy", comm.value)); return 0
  def ncclCommAbort(self, comm: Any) -> int: self.aborted.append(comm.value); return 0
  def ncclCommGetAsyncError(self, comm: Any, res: Any) -> int: res.contents.value = self.async_result; return 0
  def ncclGroupStart(self) -> int: self.in_group += 1; self.calls.append(("ncclGroupStart",)); return 0
  def ncclGroupEnd(self) -> int: self.in_group -= 1; self.calls.append(("ncclGroupEnd",)); return 0
  def ncclGetErrorString(self, code: Any) -> bytes: return f"stand-in error {code.value}".encode()
  def cuStreamQuery(self, stream: Any) -> int: return 0 if self.stream_ready else nccl.CUDA_ERROR_NOT_READY

  def _rank(self, comm: Any) -> tuple[int, int]:
    nranks, rank, _ = self.comms[comm.value]
    return nranks, rank

  def _peer(self, mine: np.ndarray) -> np.ndarray: return (mine + 1).astype(mine.dtype)

  def ncclAllReduce(self, send: Any, recv: Any, count: Any, dt: Any, op: Any, comm: Any, stream: Any) -> int:
    self.calls.append(("ncclAllReduce", send.value, recv.value, count.value, dt.value, op.value, comm.value, stream.value))
    assert self.in_group, "collectives are issued inside ncclGroupStart/End"
    n, t = count.value, NP[dt.value]
    mine = np.frombuffer((ctypes.c_byte * (n * np.dtype(t).itemsize)).from_address(send.value), t).copy()
    nranks, _ = self._rank(comm)
    vals = [mine] + ([self._peer(mine)] if nranks == 2 else [])
    red = {0: np.add.reduce, 1: np.multiply.reduce, 2: np.maximum.reduce, 3: np.minimum.reduce, 4: lambda v: np.add.reduce(v) / len(v)}[op.value]
    out = np.frombuffer((ctypes.c_byte * (n * np.dtype(t).itemsize)).from_address(recv.value), t)
    out[:] = red(np.stack(vals)).astype(t)
    return 0

  def ncclBroadcast(self, send: Any, recv: Any, count: Any, dt: Any, root: Any, comm: Any, stream: Any) -> int:
    self.calls.append(("ncclBroadcast", send.value, recv.value, count.value, dt.value, root.value, comm.value, stream.value))
    n = count.value
    mine = bytes((ctypes.c_byte * n).from_address(send.value))
    _, rank = self._rank(comm)
    data = mine if root.value == rank else bytes(self._peer(np.frombuffer(mine, np.uint8)))
    ctypes.memmove(recv.value, data, n)
    return 0

  def ncclAllGather(self, send: Any, recv: Any, count: Any, dt: Any, comm: Any, stream: Any) -> int:
    self.calls.append(("ncclAllGather", send.value, recv.value, count.value, dt.value, comm.value, stream.value))
    n = count.value
    mine = np.frombuffer(bytes((ctypes.c_byte * n).from_address(send.value)), np.uint8)
    nranks, rank = self._rank(comm)
    parts = [mine] if nranks == 1 else [self._peer(mine), mine]  # the simulated peer is rank 0
    ctypes.memmove(recv.value, np.concatenate(parts).tobytes(), n * nranks)
    return 0


def _addr(buf: Any) -> int:
  """The host address of a CPU buffer's memory: what a CUDA buffer's handle.ptr is to NCCL."""
  return int(np.frombuffer(buf.as_buffer(), np.uint8).ctypes.data)


class FakeMPI:
  """Rank 1 of a world of 2: the agreement check's all-reduce sees a peer with the same call; Ibcast delivers rank 0's
  NCCL unique id (the stand-in's)."""
  class Request:
    @staticmethod
    def Testall(reqs: list[Any]) -> bool: return True
    @staticmethod
    def Waitall(reqs: list[Any]) -> None: pass
  MAX = "max"

  def __init__(self) -> None: self.bcasts: list[tuple[bytes, int]] = []
  def Iallreduce(self, mine: np.ndarray, out: np.ndarray, op: Any) -> object: out[:] = mine; return object()
  def Ibcast(self, buf: np.ndarray, root: int) -> object:
    self.bcasts.append((buf.tobytes(), root))
    buf[:] = np.frombuffer(StandIn.UID, np.uint8)
    return object()


@pytest.fixture
def standin(monkeypatch):
  """CPU tensors routed as CUDA:0 through the stand-in; `_cuda_memory` gives their host addresses and the fake stream."""
  lib = StandIn()
  monkeypatch.setattr(comm, "_GROUP", None)
  for k in comm._LAUNCHER_ENV: monkeypatch.delenv(k, raising=False)
  monkeypatch.setenv("PLUGRAD_DIST_BACKEND", "nccl")
  monkeypatch.setattr(comm, "_load_nccl", lambda: nccl.NCCL(lib, cuda=lib, path="stand-in"))
  monkeypatch.setattr(comm, "_cuda_index", lambda device: 0 if device == "CPU" else None)
  monkeypatch.setattr(comm, "_cuda_memory", lambda buf: (_addr(buf), STREAM, None))
  monkeypatch.setattr(comm.atexit, "register", lambda *a: None)  # the stand-in's communicators need no closing
  return lib


def _rank1_of_2(monkeypatch) -> FakeMPI:
  mpi = FakeMPI()
  comm.init()
  g = comm._GROUP
  assert g is not None
  g.rank, g.size, g.comm, g.mpi = 1, 2, mpi, FakeMPI
  return mpi


CASES = [(np.float32, 7), (np.int32, 2), (np.float16, 6), (np.int64, 4), (np.float64, 8)]


@pytest.mark.parametrize("world", [1, 2])
def test_standin_all_reduce_passes_pointers_counts_dtypes_ops_and_stream(standin, monkeypatch, world):
  mpi = _rank1_of_2(monkeypatch) if world == 2 else None
  for np_dt, code in CASES:
    x = np.arange(-3, 9, dtype=np_dt).reshape(3, 4)
    for op, op_code in nccl.NCCL_OPS.items():
      if op == "mean" and not np.issubdtype(np_dt, np.floating): continue
      if op == "prod" and world == 2 and np_dt is np.float16: continue
      t = Tensor(x).realize()
      src = comm._realized(t)
      standin.calls.clear()
      r = comm.all_reduce(t, op)
      assert r.shape == (3, 4) and r.dtype == t.dtype and r.device == t.device
      ar = [c for c in standin.calls if c[0] == "ncclAllReduce"]
      assert len(ar) == 1
      _, send, recv, count, dt, nop, handle, stream = ar[0]
      assert (send, count, dt, nop, stream) == (_addr(src), 12, code, op_code, STREAM), (np_dt, op, ar)
      assert recv == _addr(comm._realized(r)) != send  # a new buffer, never the input's
      issued = [c[0] for c in standin.calls if c[0] not in ("ncclGetUniqueId", "ncclCommInitRank")]  # the first call also made the communicator
      assert issued == ["ncclGroupStart", "ncclAllReduce", "ncclGroupEnd"] and handle == 0xC0
      vals = [x.astype(np.float64)] + ([(x + 1).astype(np_dt).astype(np.float64)] if world == 2 else [])
      want = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min, "mean": np.mean}[op](np.stack(vals), axis=0)
      np.testing.assert_allclose(r.numpy().astype(np.float64), want.astype(np_dt).astype(np.float64), rtol=1e-3)
  # one communicator, made once: rank 0's id (over MPI for rank 1), this rank's number, the world's size
  assert list(standin.comms.values()) == [(world, world - 1, StandIn.UID)]
  # rank 0 (world of 1) makes the id itself; rank 1 of 2 makes none and receives rank 0's through MPI's broadcast from root 0
  assert standin.made_ids == (1 if world == 1 else 0)
  if mpi is not None: assert [root for _, root in mpi.bcasts] == [0]


@pytest.mark.parametrize("world", [1, 2])
def test_standin_broadcast_and_all_gather_move_bytes_in_rank_order(standin, monkeypatch, world):
  if world == 2: _rank1_of_2(monkeypatch)
  x = np.arange(6, dtype=np.float32).reshape(2, 3)
  t = Tensor(x).realize()
  src = comm._realized(t)
  b = comm.broadcast(t, src=0)
  bc = next(c for c in standin.calls if c[0] == "ncclBroadcast")
  assert bc[1] == _addr(src) and bc[3:6] == (24, nccl.UINT8, 0) and bc[7] == STREAM and bc[2] == _addr(comm._realized(b))
  want_b = x if world == 1 else np.frombuffer((x.view(np.uint8) + 1).astype(np.uint8).tobytes(), np.float32).reshape(2, 3)
  np.testing.assert_array_equal(b.numpy(), want_b)
  g = comm.all_gather(t, axis=1)
  ag = next(c for c in standin.calls if c[0] == "ncclAllGather")
  assert ag[1] == _addr(src) and ag[3:5] == (24, nccl.UINT8) and ag[6] == STREAM
  assert g.shape == (2, 3 * world)
  parts = [x] if world == 1 else [want_b, x]  # rank 0 (the simulated peer) first
  np.testing.assert_array_equal(g.numpy(), np.concatenate(parts, axis=1))
  if world == 2:  # a rank that is the source passes its own buffer and gets it back
    comm._GROUP.rank = 0  # type: ignore[union-attr]
    standin.comms[0xC0] = (2, 0, StandIn.UID)  # (the stand-in's communicator follows)
    np.testing.assert_array_equal(comm.broadcast(t, src=0).numpy(), x)


def test_standin_reduce_many_is_one_group_and_unsupported_dtypes_stay_on_mpi(standin, monkeypatch):
  mpi = _rank1_of_2(monkeypatch)
  ts = [Tensor(np.ones(4, np.float32)), Tensor(np.ones(3, np.float16)), Tensor(np.ones(2, np.bool_))]
  out = comm.all_reduce_many(ts, "max")
  assert [c[0] for c in standin.calls if c[0].startswith("nccl") and c[0] != "ncclCommInitRank"] == \
    ["ncclGroupStart", "ncclAllReduce", "ncclAllReduce", "ncclAllReduce", "ncclGroupEnd"]
  assert [c[4] for c in standin.calls if c[0] == "ncclAllReduce"] == [7, 6, 1]  # float32, float16, bool as uint8
  np.testing.assert_array_equal(out[0].numpy(), np.full(4, 2, np.float32))
  assert out[2].dtype == dtypes.bool and out[2].numpy().all()
  assert comm._nccl_route(comm._GROUP, Tensor(np.ones(2, np.int16)), reduce=True) is None  # type: ignore[arg-type]
  assert len(mpi.bcasts) == 1


def test_standin_timeout_aborts_the_communicator(standin, monkeypatch):
  comm.init(timeout=0.05)
  standin.stream_ready = False  # the kernel never finishes: a peer that never joined
  with pytest.raises(DistributedTimeoutError, match=r"all_reduce.*\(NCCL\) did not complete within PLUGRAD_DIST_TIMEOUT=0.05 s"):
    comm.all_reduce(Tensor([1.0, 2.0]))
  assert standin.aborted == [0xC0]
  with pytest.raises(DistributedError, match="unusable"): comm.all_reduce(Tensor([1.0]))


def test_standin_async_error_names_the_call_and_nccls_message(standin):
  standin.async_result = 6  # ncclRemoteError
  with pytest.raises(nccl.NCCLError, match=r"ncclCommGetAsyncError during all_reduce.*ncclRemoteError \(stand-in error 6\)"):
    comm.all_reduce(Tensor([1.0, 2.0]))
  assert standin.aborted == [0xC0]


def test_backend_setting(monkeypatch):
  monkeypatch.setattr(comm, "_GROUP", None)
  for k in comm._LAUNCHER_ENV: monkeypatch.delenv(k, raising=False)
  monkeypatch.setenv("PLUGRAD_DIST_BACKEND", "gloo")
  with pytest.raises(SettingsError, match="PLUGRAD_DIST_BACKEND='gloo'.*auto, mpi, nccl"): comm.init()
  monkeypatch.setenv("PLUGRAD_DIST_BACKEND", "nccl")
  monkeypatch.setenv("PLUGRAD_NCCL_LIB", "/nonexistent/libnccl.so.2")
  monkeypatch.setattr(comm, "_cuda_index", lambda device: 0)
  with pytest.raises(DistributedError, match="cannot load NCCL"): comm.all_reduce(Tensor([1.0]))
  monkeypatch.setattr(comm, "_GROUP", None)
  monkeypatch.setenv("PLUGRAD_DIST_BACKEND", "auto")  # auto without libnccl: host staging, as before
  np.testing.assert_array_equal(comm.all_reduce(Tensor([1.0])).numpy(), [1.0])


def test_cuda_index_and_duck_typed_memory():
  assert [comm._cuda_index(d) for d in ("CUDA", "CUDA:3", "CPU", "PYTHON:1")] == [0, 3, None, None]

  class Ctx:
    stream = ctypes.c_void_p(STREAM)
    def activate(self) -> None: pass

  class Alloc: ctx = Ctx()
  class Handle: ptr = 0x7000
  class Buf:  # what a CUDABuffer-backed Buffer exposes: handle.ptr, allocator.ctx.stream
    handle, allocator = Handle(), Alloc()

  ptr, stream, activate = comm._cuda_memory(Buf())
  assert (ptr, stream) == (0x7000, STREAM) and activate is not None
  Buf.handle = object()  # type: ignore[assignment]
  with pytest.raises(DistributedError, match="no int attribute `ptr`"): comm._cuda_memory(Buf())
  Buf.handle, Buf.allocator = Handle(), object()  # type: ignore[assignment]
  with pytest.raises(DistributedError, match=r"no `ctx.stream`"): comm._cuda_memory(Buf())
