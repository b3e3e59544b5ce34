"""The process group and the collectives on Tensors (docs/distributed.md).

One process per rank, started by an MPI launcher (`mpirun -np 2 python train.py`); the ranks talk through mpi4py on the
MPI library of the machine (Open MPI here). A process not started by a launcher is a world of one: every collective
returns its input's values, and mpi4py is not needed.

Data goes through host memory: a tensor is realized and MPI reads its buffer (the device memory itself where the
allocator offers host access, as the CPU and PYTHON devices do; a copy otherwise), and the result is received into a new
buffer on the tensor's device. Every collective is non-blocking underneath and waited for with a deadline
(PLUGRAD_DIST_TIMEOUT), so a rank that stops answering makes the others raise DistributedTimeoutError instead of hanging.

CUDA tensors go through NCCL instead (nccl.py; PLUGRAD_DIST_BACKEND): the collective runs on the device pointers, on the
device's stream, into a new buffer on the device; MPI only carries NCCL's unique id and the agreement check.
UNVERIFIED HERE (no GPU on the development machine): that path is tested against a stand-in NCCL (tests/distributed/test_nccl.py).
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import hashlib
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np

from plugrad.distributed.errors import DistributedError, DistributedTimeoutError
from plugrad.dtype import DType, dtypes
from plugrad.engine.buffers import buffer_of, new_buffer
from plugrad.helpers import SettingsError, getenv, prod
from plugrad.tensor import Tensor
from plugrad.tensor.helpers import ints
from plugrad.uop.ops import Ops, UOp

if TYPE_CHECKING:
  from plugrad.device.buffer import Buffer
  from plugrad.distributed.nccl import NCCL

__all__ = ["OPS", "DistributedError", "DistributedTimeoutError", "all_gather", "all_reduce", "all_reduce_many", "barrier", "broadcast", "init",
           "is_initialized", "rank", "world_size"]

OPS = ("sum", "mean", "max", "min", "prod")
DEFAULT_TIMEOUT = 300.0  # seconds: longer than any legitimate wait in a step (a first compile, rank 0 writing a checkpoint)
_SPIN_S = 0.1            # waits shorter than this busy-poll, as MPI's blocking calls do (it progresses only inside its calls); then yield
_NAP_AFTER_S = 1.0       # a wait this long is a peer doing something else (saving, evaluating): poll every few ms from then on
# markers an MPI launcher leaves in each process's environment (Open MPI, MPICH/Hydra and PMI-2, PMIx launchers such as srun)
_LAUNCHER_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")
BACKENDS = ("auto", "mpi", "nccl")  # PLUGRAD_DIST_BACKEND


@dataclass
class _Group:
  rank: int
  size: int
  timeout: float
  comm: Any = None              # mpi4py's COMM_WORLD; None in a world of one without a launcher
  mpi: Any = None               # the mpi4py.MPI module
  seq: int = 0                  # collectives issued so far (all ranks count the same, or the agreement check says which differs)
  broken: str | None = None     # why the group can no longer be used (a timed-out request may still be pending)
  pending: list[Any] = field(default_factory=list)  # timed-out requests: they hold their buffers, which MPI may still write
  backend: str = "auto"         # PLUGRAD_DIST_BACKEND: how CUDA tensors travel
  nccl: NCCL | None = None      # libnccl, once a CUDA collective has loaded it
  nccl_comms: dict[int, tuple[int, int]] = field(default_factory=dict)  # CUDA device index -> (creation ordinal, ncclComm_t)


_GROUP: _Group | None = None


def _launched() -> bool: return any(os.environ.get(k) for k in _LAUNCHER_ENV)


def init(min_world_size: int = 1, timeout: float | None = None) -> _Group:
  """Join the process group (once; later calls only check `min_world_size`). Under an MPI launcher this initializes MPI
  through mpi4py; without one the process is a world of one. `min_world_size` > 1 makes a program that needs several
  processes refuse to run alone. `timeout` (seconds, 0 = none) overrides PLUGRAD_DIST_TIMEOUT for every collective."""
  global _GROUP
  if not isinstance(min_world_size, int) or isinstance(min_world_size, bool) or min_world_size < 1:
    raise ValueError(f"init: min_world_size must be an int >= 1, got {min_world_size!r}")
  if timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 <= timeout <= 1e9):
    raise ValueError(f"init: timeout must be a number of seconds >= 0 (0: no deadline), got {timeout!r}")
  g = _GROUP
  if g is None:
    limit = float(timeout) if timeout is not None else float(getenv("PLUGRAD_DIST_TIMEOUT", DEFAULT_TIMEOUT, minimum=0, maximum=1e9))
    if limit != limit: raise SettingsError(f"PLUGRAD_DIST_TIMEOUT={os.environ.get('PLUGRAD_DIST_TIMEOUT')!r} is not valid: expected a number >= 0 "
                                           "(0: no deadline; docs/env-vars.md)")
    backend = os.environ.get("PLUGRAD_DIST_BACKEND", "auto").strip().lower() or "auto"
    if backend not in BACKENDS: raise SettingsError(f"PLUGRAD_DIST_BACKEND={os.environ['PLUGRAD_DIST_BACKEND']!r} is not valid: expected one of "
                                                    f"{', '.join(BACKENDS)} (docs/env-vars.md)")
    g = _mpi_group(limit) if _launched() else _Group(0, 1, limit)
    g.backend = backend
    _GROUP = g
  if g.size < min_world_size:
    how = "launched by mpirun with one process" if g.comm is not None else "not launched by an MPI launcher (a world of one process)"
    raise DistributedError(f"this program needs at least {min_world_size} processes but was {how}; start it with "
                           f"`mpirun -np {min_world_size} python {os.path.basename(sys.argv[0]) or 'SCRIPT'} ...` (docs/distributed.md)")
  return g


def _mpi_group(timeout: float) -> _Group:
  size = next((os.environ[k] for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE") if os.environ.get(k)), "?")
  try:
    from mpi4py import MPI
  except ImportError as e:
    raise DistributedError(f"this process was started by an MPI launcher (world size {size}) but mpi4py cannot be imported ({e}); install it "
                           "with `pip install mpi4py` (or `pip install 'plugrad[mpi]'`) next to an MPI library such as Open MPI "
                           "(apt-get install openmpi-bin libopenmpi-dev)") from e
  comm = MPI.COMM_WORLD
  group = _Group(comm.Get_rank(), comm.Get_size(), timeout, comm, MPI)
  if group.size > 1: _abort_on_uncaught(group)
  atexit.register(_at_exit, group)  # after mpi4py's own atexit hook (MPI_Finalize), so it runs before it
  return group


def _abort_on_uncaught(group: _Group) -> None:
  """An exception that ends one rank ends the job: otherwise MPI_Finalize at its exit waits for peers that wait for it in
  their next collective (until their deadline). The traceback is printed first, then MPI_Abort stops every rank."""
  previous = sys.excepthook
  def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    previous(kind, value, tb)
    if issubclass(kind, KeyboardInterrupt): return
    sys.stderr.write(f"plugrad.distributed: rank {group.rank} ended with {kind.__name__}: aborting the MPI job\n")
    sys.stdout.flush(); sys.stderr.flush()
    group.comm.Abort(1)
  sys.excepthook = hook


def _at_exit(group: _Group) -> None:
  # MPI_Finalize would wait forever on a request a dead peer never completes: end the whole job instead
  if group.broken is not None:
    sys.stdout.flush()
    sys.stderr.write(f"plugrad.distributed: rank {group.rank} exits after {group.broken}: aborting the MPI job\n")
    sys.stderr.flush()
    group.comm.Abort(1)


def _group() -> _Group:
  g = _GROUP or init()
  if g.broken is not None: raise DistributedError(f"rank {g.rank}: the process group is unusable since {g.broken}; restart the job")
  return g


def is_initialized() -> bool: return _GROUP is not None
def rank() -> int: return _group().rank
def world_size() -> int: return _group().size


# ---------------------------------------------------------------- waiting with a deadline

def _poll(g: _Group, done: Callable[[], bool], what: str, on_timeout: Callable[[], str]) -> None:
  """Call `done()` until it is true or the group's deadline passes: busy at first (MPI and NCCL progress inside their
  calls), then yielding, then napping. At the deadline `on_timeout()` leaves the group broken and says what became of
  the pending work, and DistributedTimeoutError is raised."""
  start, nap = time.monotonic(), 1e-4
  while not done():
    waited = time.monotonic() - start
    if waited > g.timeout:
      raise DistributedTimeoutError(f"rank {g.rank} of {g.size}: {what} did not complete within PLUGRAD_DIST_TIMEOUT={g.timeout:g} s: "
                                    f"another rank died, hangs, or did not call it ({on_timeout()})")
    if waited > _NAP_AFTER_S:
      time.sleep(nap)
      nap = min(nap * 2, 5e-3)
    elif waited > _SPIN_S: os.sched_yield()


def _wait(g: _Group, reqs: list[Any], what: str) -> None:
  """Wait for `reqs` (mpi4py requests) until the group's deadline; a timeout leaves the group broken (the requests stay
  pending in MPI: no later collective could be matched with the peers) and raises DistributedTimeoutError."""
  if not reqs: return
  Request = g.mpi.Request
  if g.timeout == 0:
    Request.Waitall(reqs)
    return
  def broken() -> str:
    g.broken = f"{what} timed out after {g.timeout:g} s"
    g.pending += reqs
    return "the job is aborted when this process exits"
  _poll(g, lambda: bool(Request.Testall(reqs)), what, broken)


def _agree(g: _Group, what: str) -> None:
  """Check that every rank is at the same collective with the same arguments (a mismatch would otherwise deadlock, or
  read the wrong number of bytes): one tiny all-reduce of the description's digest (max of h and of -h)."""
  g.seq += 1
  desc = f"#{g.seq} {what}"
  h = int.from_bytes(hashlib.blake2b(desc.encode(), digest_size=7).digest(), "little")
  mine = np.array([h, -h], np.int64)
  both = np.empty_like(mine)
  _wait(g, [g.comm.Iallreduce(mine, both, op=g.mpi.MAX)], f"collective #{g.seq} {what}")
  if both[0] != -both[1]:
    # every rank saw the mismatch, so every rank is here: exchange the descriptions to say who differs
    descs = g.comm.allgather(desc)
    listing = "; ".join(f"rank {r}: {d}" for r, d in enumerate(descs))
    raise DistributedError(f"rank {g.rank}: the ranks called different collectives or with different arguments: {listing}")


# ---------------------------------------------------------------- host staging

def _check(t: Any, what: str) -> None:
  if not isinstance(t, Tensor): raise TypeError(f"{what} needs a Tensor, got a {type(t).__name__}")
  _device(t, what)
  ints(t.shape, what)


def _device(t: Tensor, what: str) -> str:
  if not isinstance(dev := t.device, str):
    raise TypeError(f"{what} takes a tensor on one device, got one on {dev}: move it with .to(device) first (sharding across devices "
                    "in one process is docs/sharding.md's)")
  return dev


def _dtname(dt: DType) -> str: return "bfloat16" if dt is dtypes.bfloat16 else np.dtype(dtypes.to_numpy(dt)).name
def _describe(t: Tensor) -> str: return f"shape={tuple(t.shape)} dtype={_dtname(t.dtype)}"


def _realized(t: Tensor) -> Buffer:
  """`t`'s values in one allocated, contiguous device buffer."""
  c = t.contiguous().realize()
  u = c.uop if c.uop.op is Ops.BUFFER else c.uop.src[0]
  return buffer_of(u).ensure_allocated()


def _host(t: Tensor) -> memoryview:
  """The bytes of `t`'s buffer, realized: the device memory itself where its allocator gives host access, else a copy."""
  return _realized(t).as_buffer()


class _Out:
  """A new buffer on `device` and a writable byte array MPI receives into: the buffer's own memory where the allocator
  gives writable host access, else host memory copied in by `tensor()`."""
  def __init__(self, device: str, shape: tuple[int, ...], dtype: DType):
    self.shape, self.n = shape, prod(shape)
    self.u = new_buffer(device, self.n, dtype)
    self.buf = buffer_of(self.u).allocate() if self.n else None
    mv = self.buf.as_buffer() if self.buf is not None and self.buf.allocator.supports_memoryview else None
    self.direct = mv is not None and not mv.readonly
    self.bytes = np.frombuffer(mv, np.uint8) if mv is not None and self.direct else np.empty(self.n * dtype.itemsize, np.uint8)

  def tensor(self) -> Tensor:
    if self.buf is not None and not self.direct: self.buf.copyin(self.bytes.data)
    return Tensor(self.u.reshape(self.shape))


# ---------------------------------------------------------------- NCCL (CUDA tensors)

def _load_nccl() -> NCCL:
  from plugrad.distributed import nccl  # only a CUDA collective needs it
  return nccl.load()


def _cuda_index(device: str) -> int | None:
  """The device index of a CUDA device string ("CUDA" → 0, "CUDA:1" → 1), None for any other device."""
  base, _, index = device.partition(":")
  return (int(index) if index else 0) if base == "CUDA" else None


def _nccl_route(g: _Group, t: Tensor, reduce: bool = False) -> int | None:
  """The CUDA device index whose NCCL communicator runs `t`'s collective, or None: MPI with host staging. `reduce`: an
  all-reduce, which needs a dtype NCCL reduces (int16/uint16 and the like go through MPI)."""
  if g.backend == "mpi" or (idx := _cuda_index(_device(t, "a collective"))) is None: return None
  if g.comm is None and g.backend == "auto": return None  # a world of one: a copy is all a collective does
  if reduce:
    from plugrad.distributed.nccl import NCCL_DTYPES
    if t.dtype not in NCCL_DTYPES: return None
  if g.nccl is None:
    try: g.nccl = _load_nccl()
    except DistributedError:
      if g.backend == "nccl": raise
      return None  # auto: no libnccl here, so CUDA tensors are staged through the host
  return idx


def _nccl_tag(g: _Group, routes: Sequence[int | None]) -> str:
  """What the agreement check adds for NCCL: the ordinal of the communicator each tensor uses (new ones numbered in order
  of first use), so ranks that would create communicators in a different order, or route a tensor differently, fail
  the check instead of hanging in ncclCommInitRank."""
  if all(r is None for r in routes): return ""
  new: dict[int, int] = {}
  def ordinal(idx: int) -> int:
    if (hit := g.nccl_comms.get(idx)) is not None: return hit[0]
    return new.setdefault(idx, len(g.nccl_comms) + len(new))
  return " nccl[" + ",".join("mpi" if r is None else f"comm{ordinal(r)}" for r in routes) + "]"


def _cuda_memory(buf: Any) -> tuple[int, int | None, Callable[[], Any] | None]:
  """(device pointer, stream, the context's activate) of an allocated CUDA buffer, read duck-typed (the core does not
  import the CUDA plugin): the handle's `ptr` and the allocator's `ctx.stream` (and `ctx.activate`, when it has one)."""
  handle = buf.handle
  if not isinstance(ptr := getattr(handle, "ptr", None), int) or isinstance(ptr, bool):
    raise DistributedError(f"NCCL needs the device pointer of {buf!r}: its handle ({type(handle).__name__}) has no int attribute `ptr`")
  ctx = getattr(buf.allocator, "ctx", None)
  if ctx is None or not hasattr(ctx, "stream"):
    raise DistributedError(f"NCCL needs the stream of {buf!r}: its allocator ({type(buf.allocator).__name__}) has no `ctx.stream`")
  stream = ctx.stream.value if isinstance(ctx.stream, ctypes.c_void_p) else ctx.stream
  if stream is not None and (not isinstance(stream, int) or isinstance(stream, bool)):
    raise DistributedError(f"NCCL needs a CUDA stream handle (an int or a ctypes.c_void_p) from {buf!r}'s allocator, got {stream!r}")
  activate = getattr(ctx, "activate", None)
  return ptr, stream, activate if callable(activate) else None


def _nccl_comm(g: _Group, idx: int, activate: Callable[[], Any] | None) -> int:
  """This process's communicator for CUDA device `idx`, created on first use: rank 0's unique id goes to every rank over
  MPI, then ncclCommInitRank with the device's context current (NCCL runs on the current device)."""
  assert g.nccl is not None
  if (hit := g.nccl_comms.get(idx)) is not None: return hit[1]
  from plugrad.distributed.nccl import UNIQUE_ID_BYTES
  uid = g.nccl.unique_id() if g.rank == 0 else bytes(UNIQUE_ID_BYTES)
  if g.comm is not None:
    arr = np.frombuffer(bytearray(uid), np.uint8)
    _wait(g, [g.comm.Ibcast(arr, root=0)], f"the NCCL unique id broadcast for CUDA:{idx}")
    uid = arr.tobytes()
  if activate is not None: activate()
  comm = g.nccl.comm_init_rank(g.size, uid, g.rank)
  if not g.nccl_comms: atexit.register(_close_nccl, g)  # registered after mpi4py's hook: runs before MPI_Finalize
  g.nccl_comms[idx] = (len(g.nccl_comms), comm)
  return comm


def _close_nccl(g: _Group) -> None:
  # a communicator whose collective never finished cannot be destroyed (ncclCommDestroy would wait for it): abort those
  if g.nccl is None: return
  for _, comm in g.nccl_comms.values():
    with contextlib.suppress(DistributedError): (g.nccl.abort if g.broken is not None else g.nccl.destroy)(comm)
  g.nccl_comms.clear()


def _nccl_break(g: _Group, why: str) -> None:
  """After a failed or timed-out NCCL collective the peers' kernels may wait forever: abort every communicator (NCCL's
  documented way out), which also leaves the group unusable."""
  g.broken = g.broken or why
  _close_nccl(g)


def _nccl_run(g: _Group, calls: list[tuple[Callable[[], Any] | None, Callable[[], None]]], streams: set[int | None], what: str) -> None:
  """Enqueue the NCCL calls (each after activating its device's context) as one NCCL group, then wait for their streams
  with the group's deadline, polling ncclCommGetAsyncError; a timeout or an asynchronous error aborts the communicators.
  With no deadline (PLUGRAD_DIST_TIMEOUT=0) there is no wait: later work on the stream is ordered after the collective."""
  if not calls: return  # no NCCL tensor in this collective (or only empty ones)
  nc = g.nccl
  assert nc is not None
  try:
    nc.group_start()
    try:
      for activate, call in calls:
        if activate is not None: activate()
        call()
    except BaseException:
      with contextlib.suppress(DistributedError): nc.group_end()
      raise
    nc.group_end()
  except DistributedError as e:
    _nccl_break(g, f"{what} failed in NCCL")
    raise DistributedError(f"rank {g.rank} of {g.size}: {what}: {e} (the communicators are aborted; restart the job)") from e
  if g.timeout == 0: return
  comms = [comm for _, comm in g.nccl_comms.values()]
  def done() -> bool:
    for comm in comms:
      if (err := nc.async_error(comm)) not in (0, 7):  # ncclSuccess, ncclInProgress
        from plugrad.distributed.nccl import NCCLError
        _nccl_break(g, f"{what} failed in NCCL")
        raise NCCLError(f"ncclCommGetAsyncError during {what} on rank {g.rank} of {g.size}", err, nc._text(err))
    return all(nc.stream_done(s) for s in streams)
  def broken() -> str:
    _nccl_break(g, f"{what} timed out after {g.timeout:g} s")
    return "its NCCL communicators are aborted"
  _poll(g, done, f"{what} (NCCL)", broken)


def _device_out(device: str, n: int, dtype: DType) -> tuple[UOp, Buffer | None]:
  """A new allocated buffer of `n` elements on `device` (None when empty) for NCCL to write."""
  u = new_buffer(device, n, dtype)
  return u, (buffer_of(u).allocate() if n else None)


class _NCCLJob:
  """The NCCL calls of one collective: each source buffer and result stays referenced until the wait is over."""
  def __init__(self, g: _Group):
    self.g = g
    self.calls: list[tuple[Callable[[], Any] | None, Callable[[], None]]] = []
    self.streams: set[int | None] = set()
    self.keep: list[Any] = []

  def add(self, idx: int, src: Any, out: Any, issue: Callable[[int, int, int, int | None], None]) -> None:
    """`issue(send_ptr, recv_ptr, comm, stream)` enqueues the call for `src` → `out` on device `idx`'s communicator."""
    sp, stream, activate = _cuda_memory(src)
    rp, _, _ = _cuda_memory(out)
    comm = _nccl_comm(self.g, idx, activate)
    self.calls.append((activate, lambda: issue(sp, rp, comm, stream)))
    self.streams.add(stream)
    self.keep += [src, out]

  def run(self, what: str) -> None: _nccl_run(self.g, self.calls, self.streams, what)


# ---------------------------------------------------------------- the collectives

# dtypes MPI reduces natively (the rest go through float32); bool only with the logical ops
_NATIVE = {dtypes.float32, dtypes.float64, dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint16, dtypes.uint32,
           dtypes.uint64, dtypes.bool}


def _reduce_plan(t: Tensor, op: str) -> DType:
  """The dtype the reduction runs in (checking `op` against `t`'s dtype)."""
  if op not in OPS: raise ValueError(f"all_reduce: op must be one of {', '.join(OPS)}; got {op!r}")
  if t.dtype is dtypes.bool and op not in ("max", "min"):
    raise TypeError(f"all_reduce: a bool tensor reduces with op='max' (any rank True) or 'min' (all ranks True), not {op!r}")
  if op == "mean" and not dtypes.is_float(t.dtype):
    raise TypeError(f"all_reduce: op='mean' needs a float tensor, got {_dtname(t.dtype)} (reduce with 'sum' and divide as you need)")
  return t.dtype if t.dtype in _NATIVE else dtypes.float32


def _mpi_op(g: _Group, op: str, dt: DType) -> Any:
  M = g.mpi
  if dt is dtypes.bool: return M.LOR if op == "max" else M.LAND
  return {"sum": M.SUM, "mean": M.SUM, "max": M.MAX, "min": M.MIN, "prod": M.PROD}[op]


def _copy(t: Tensor, shape: tuple[int, ...]) -> Tensor:
  """A new buffer with `t`'s values (a world of one: what each collective gives back; never an alias of `t`'s buffer)."""
  out = _Out(_device(t, "a collective"), shape, t.dtype)
  if out.n: out.bytes[:] = np.frombuffer(_host(t), np.uint8)
  return out.tensor()


def all_reduce(t: Tensor, op: str = "sum") -> Tensor:
  """The element-wise reduction of `t` over every rank (`op`: sum, mean, max, min or prod), the same on every rank: a new
  tensor of `t`'s shape, dtype and device. float16 and bfloat16 are reduced in float32 and rounded once; 'mean' needs a
  float tensor; a bool tensor takes 'max' (logical or) or 'min' (logical and)."""
  return all_reduce_many([t], op)[0]


def all_reduce_many(ts: Sequence[Tensor], op: str = "sum", what: str | None = None) -> list[Tensor]:
  """all_reduce of several tensors at once: one agreement check, every reduction in flight together (`what` names them
  in errors). The data-parallel wrapper reduces its gradient buckets this way."""
  if not isinstance(ts, (list, tuple)): raise TypeError(f"all_reduce_many needs a list of Tensors, got a {type(ts).__name__}")
  for t in ts: _check(t, "all_reduce")
  works = [_reduce_plan(t, op) for t in ts]
  g = _group()
  shapes = [ints(t.shape, 'all_reduce') for t in ts]
  routes = [_nccl_route(g, t, reduce=True) for t in ts]
  if g.comm is None and all(r is None for r in routes): return [_copy(t, shape) for t, shape in zip(ts, shapes)]
  what = what or f"all_reduce(op={op}, {', '.join(_describe(t) for t in ts)})"
  if g.comm is not None: _agree(g, what + _nccl_tag(g, routes))
  reqs: list[Any] = []
  finish: list[tuple[np.ndarray | None, Callable[[], Tensor]]] = []
  job = _NCCLJob(g)
  for t, shape, work, idx in zip(ts, shapes, works, routes):
    if idx is not None:  # NCCL on the device: the tensor's own dtype (float16/bfloat16 reduced natively), ncclAvg for mean
      from plugrad.distributed.nccl import NCCL_DTYPES, NCCL_OPS
      u, dbuf = _device_out(_device(t, "all_reduce"), prod(shape), t.dtype)
      if dbuf is not None:
        assert g.nccl is not None
        job.add(idx, _realized(t), dbuf, _nccl_all_reduce(g.nccl, dbuf.size, NCCL_DTYPES[t.dtype], NCCL_OPS[op]))
      finish.append((None, functools.partial(_as_tensor, u, shape)))
      continue
    mop = _mpi_op(g, op, work)
    if work is t.dtype:  # straight from the tensor's buffer into the result's
      out = _Out(_device(t, "all_reduce"), shape, t.dtype)
      recv = out.bytes.view(dtypes.to_numpy(work))
      if out.n: reqs.append(g.comm.Iallreduce(np.frombuffer(_host(t), recv.dtype), recv, op=mop))
      finish.append((recv, out.tensor))
    else:  # float16 / bfloat16: reduced in float32, rounded back once
      send = t.float().numpy().reshape(-1)
      res = np.empty_like(send)
      if send.size: reqs.append(g.comm.Iallreduce(send, res, op=mop))
      finish.append((res, _rounded(res, t, shape)))
  job.run(what)
  _wait(g, reqs, what)
  if op == "mean":
    for arr, _ in finish:
      if arr is not None: np.divide(arr, g.size, out=arr)
  return [make() for _, make in finish]


def _rounded(res: np.ndarray, t: Tensor, shape: tuple[int, ...]) -> Callable[[], Tensor]:
  return lambda: Tensor(res.reshape(shape), device=t.device).cast(t.dtype).realize()


def _nccl_all_reduce(nc: NCCL, n: int, ndt: int, nop: int) -> Callable[[int, int, int, int | None], None]:
  return lambda sp, rp, comm, stream: nc.all_reduce(sp, rp, n, ndt, nop, comm, stream)


def _as_tensor(u: UOp, shape: tuple[int, ...]) -> Tensor: return Tensor(u.reshape(shape))


def all_gather(t: Tensor, axis: int = 0) -> Tensor:
  """Every rank's `t` concatenated along `axis` in rank order (a 0-d `t`: stacked into shape (world_size,)). All ranks
  must pass tensors of one shape and dtype."""
  _check(t, "all_gather")
  if not isinstance(axis, int) or isinstance(axis, bool): raise TypeError(f"all_gather: axis must be an int, got {axis!r}")
  shape = ints(t.shape, 'all_gather')
  nd = max(len(shape), 1)
  if not -nd <= axis < nd: raise ValueError(f"all_gather: axis {axis} is out of range for a tensor of shape {shape}")
  axis %= nd
  g = _group()
  idx = _nccl_route(g, t)
  if g.comm is None and idx is None: return _copy(t, shape or (1,))
  what = f"all_gather(axis={axis}, {_describe(t)})"
  if g.comm is not None: _agree(g, what + _nccl_tag(g, [idx]))
  if idx is not None:  # NCCL: every rank's bytes, in rank order, into one buffer of (world, *shape)
    u, buf = _device_out(_device(t, "all_gather"), g.size * prod(shape), t.dtype)
    if buf is not None:
      job, nc, nbytes = _NCCLJob(g), g.nccl, prod(shape) * t.dtype.itemsize
      assert nc is not None
      from plugrad.distributed.nccl import UINT8
      job.add(idx, _realized(t), buf, lambda sp, rp, comm, stream: nc.all_gather(sp, rp, nbytes, UINT8, comm, stream))
      job.run(what)
    stacked = Tensor(u.reshape((g.size, *shape)))
  else:
    assert g.comm is not None
    out = _Out(_device(t, "all_gather"), (g.size, *shape), t.dtype)
    if out.n: _wait(g, [g.comm.Iallgather(np.frombuffer(_host(t), np.uint8), out.bytes)], what)
    stacked = out.tensor()
  if not shape or axis == 0: return stacked.reshape(g.size * (shape[0] if shape else 1), *shape[1:])
  # (world, *shape) in rank order: the world axis moved next to `axis` and merged with it
  moved = stacked.permute(*range(1, axis + 1), 0, *range(axis + 1, len(shape) + 1))
  return moved.reshape(*shape[:axis], g.size * shape[axis], *shape[axis + 1:])


def broadcast(t: Tensor, src: int = 0) -> Tensor:
  """Rank `src`'s `t` on every rank (a new tensor); the other ranks' `t` gives the shape and dtype and must match it."""
  _check(t, "broadcast")
  g = _group()
  if not isinstance(src, int) or isinstance(src, bool) or not 0 <= src < g.size:
    raise ValueError(f"broadcast: src must be a rank in [0, {g.size}), got {src!r}")
  shape = ints(t.shape, 'broadcast')
  idx = _nccl_route(g, t)
  if g.comm is None and idx is None: return _copy(t, shape)
  what = f"broadcast(src={src}, {_describe(t)})"
  if g.comm is not None: _agree(g, what + _nccl_tag(g, [idx]))
  if idx is not None:  # NCCL: rank src's bytes into a new buffer on every rank (src's own result included)
    u, buf = _device_out(_device(t, "broadcast"), prod(shape), t.dtype)
    if buf is not None:
      job, nc, nbytes = _NCCLJob(g), g.nccl, prod(shape) * t.dtype.itemsize
      assert nc is not None
      from plugrad.distributed.nccl import UINT8
      job.add(idx, _realized(t), buf, lambda sp, rp, comm, stream: nc.broadcast(sp, rp, nbytes, UINT8, src, comm, stream))
      job.run(what)
    return Tensor(u.reshape(shape))
  assert g.comm is not None
  out = _Out(_device(t, "broadcast"), shape, t.dtype)
  if out.n:
    if g.rank == src: out.bytes[:] = np.frombuffer(_host(t), np.uint8)
    _wait(g, [g.comm.Ibcast(out.bytes, root=src)], what)
  return out.tensor()


def barrier() -> None:
  """Return once every rank has called barrier() (or raise DistributedTimeoutError after the deadline)."""
  g = _group()
  # the agreement check is an all-reduce, which no rank leaves before every rank has entered it: it is the barrier, and
  # it also catches a rank that called another collective
  if g.comm is not None: _agree(g, "barrier()")
