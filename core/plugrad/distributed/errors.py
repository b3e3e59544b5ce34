"""The errors of plugrad.distributed (the MPI collectives in comm.py, NCCL's in nccl.py)."""


class DistributedError(RuntimeError):
  """A collective or the process group failed: mpi4py missing under a launcher, too few processes, ranks that disagree on
  a collective, or a group left unusable by an earlier failure. The message names the operation and the rank."""


class DistributedTimeoutError(DistributedError, TimeoutError):
  """A collective did not complete within PLUGRAD_DIST_TIMEOUT seconds: another rank died, hangs, or never called it."""
