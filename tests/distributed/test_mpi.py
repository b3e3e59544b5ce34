"""plugrad.distributed over real MPI: each test launches `mpirun -np 2` on this host (shared memory between the ranks,
the launcher's own channel on loopback) running tests/distributed/mpi_worker.py, and reads what the ranks printed. The
world-of-one path (no launcher) runs in this process. docs/distributed.md, "What is verified"."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import plugrad.distributed as dist
from plugrad import Tensor, dtypes
from plugrad.distributed import comm
from plugrad.helpers import SettingsError
from plugrad.nn.optim import SGD

WORKER = Path(__file__).with_name("mpi_worker.py")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MPIRUN = shutil.which("mpirun")
needs_mpi = pytest.mark.skipif(MPIRUN is None or importlib.util.find_spec("mpi4py") is None,
                               reason="needs Open MPI's mpirun (apt-get install openmpi-bin libopenmpi-dev) and mpi4py (pip install mpi4py)")
TIMEOUT = 3  # PLUGRAD_DIST_TIMEOUT of the failure tests, seconds
# One rank per core, one thread each, on loopback and shared memory only; root may launch (CI runs as root in a container);
# single_copy_mechanism=none: CMA (process_vm_readv) is refused in many containers
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_btl": "self,vader",
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none", "OMPI_MCA_oob_tcp_if_include": "lo", "OMPI_MCA_rmaps_base_oversubscribe": "1",
           "OMPI_MCA_hwloc_base_binding_policy": "none", "THREADS": "1"}


def mpirun(*args: str, script: Path = WORKER, flags: tuple[str, ...] = (), limit_s: float | None = None, **env: str) -> subprocess.CompletedProcess:
  """`mpirun -np 2 python SCRIPT ARGS`; `limit_s`: the whole launch must end within it (a test of not hanging)."""
  assert MPIRUN is not None
  cmd = [MPIRUN, "-np", "2", *flags, sys.executable, str(script), *args]
  t0 = time.monotonic()
  out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, **MPI_ENV, **env})
  took = time.monotonic() - t0
  assert limit_s is None or took < limit_s, f"mpirun took {took:.1f} s (limit {limit_s} s)\n{out.stdout}\n{out.stderr}"
  return out


@needs_mpi
def test_collectives_equal_numpy_over_dtypes_shapes_and_ops():
  """all_reduce (sum/mean/max/min/prod), all_gather along every axis, broadcast from each rank, for 9 dtypes x 5 shapes
  (0-d and empty included) against numpy; mismatched calls raise DistributedError naming both ranks' arguments; the
  data-parallel wrapper broadcasts rank 0's weights and averages gradients through several buckets."""
  out = mpirun("collectives")
  assert out.returncode == 0, out.stdout + out.stderr
  assert "rank 0: 433 collective checks OK" in out.stdout and "rank 1: 433 collective checks OK" in out.stdout, out.stdout + out.stderr


@needs_mpi
def test_two_ranks_with_half_batches_equal_one_process_with_the_whole(tmp_path):
  """20 SGD steps (momentum 0.9) of an MLP: 2 ranks x batch 8 (DistributedOptimizer.step(), and make_step's two TinyJit
  captures) give the parameters of 1 process x batch 16 within rtol 1e-5, atol 1e-6 (float32: only the order of the
  gradient sums differs)."""
  out = mpirun("train", str(tmp_path / "two.npz"), "16")
  assert out.returncode == 0, out.stdout + out.stderr
  one = subprocess.run([sys.executable, str(WORKER), "train", str(tmp_path / "one.npz"), "16"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "THREADS": "1"})
  assert one.returncode == 0, one.stdout + one.stderr
  two, ref = np.load(tmp_path / "two.npz"), np.load(tmp_path / "one.npz")
  for mode in ("step", "jit"):
    for k in ("l1.weight", "l1.bias", "l2.weight", "l2.bias"):
      np.testing.assert_allclose(two[f"{mode}.{k}"], ref[f"plain.{k}"], rtol=1e-5, atol=1e-6, err_msg=f"{mode} {k}")
      assert not np.array_equal(ref[f"plain.{k}"], np.zeros_like(ref[f"plain.{k}"]))


@needs_mpi
@pytest.mark.parametrize("case,flags", [("stuck", ()), ("kill", ("--enable-recovery",))], ids=["rank-hangs", "rank-killed-job-kept"])
def test_a_rank_that_stops_answering_makes_the_other_raise_within_the_timeout(case, flags):
  """Rank 1 hangs (sleeps) or is SIGKILLed (with --enable-recovery, so Open MPI keeps the job running) at step 3: rank 0
  raises DistributedTimeoutError naming the op, its rank and the timeout after PLUGRAD_DIST_TIMEOUT, then aborts the job:
  left uncaught (the hung rank), or caught and the program returning normally (the killed one: MPI_Finalize would wait
  for the dead rank, so the exit hook aborts instead)."""
  out = mpirun(case, flags=flags, limit_s=TIMEOUT + 40, PLUGRAD_DIST_TIMEOUT=str(TIMEOUT))
  text = out.stdout + out.stderr
  line = next((ln for ln in out.stdout.splitlines() if ln.startswith("rank 0 raised DistributedTimeoutError after")), None)
  assert line is not None, text
  waited = float(line.split("after ")[1].split(" s:")[0])
  assert TIMEOUT <= waited < TIMEOUT + 5, line
  assert "rank 0 of 2: collective #4 all_reduce(op=mean" in line and f"PLUGRAD_DIST_TIMEOUT={TIMEOUT} s" in line
  assert ("rank 0 ended with DistributedTimeoutError: aborting the MPI job" if case == "stuck" else
          "rank 0 exits after collective #4 all_reduce(op=mean, shape=(1000,) dtype=float32) timed out after 3 s: aborting the MPI job") in text, text


@needs_mpi
def test_a_killed_rank_ends_the_job_at_once():
  """Without --enable-recovery, Open MPI itself ends the job when a rank dies (SIGKILL): the survivor is stopped in
  seconds, long before PLUGRAD_DIST_TIMEOUT, and mpirun fails naming the rank."""
  out = mpirun("kill", limit_s=40, PLUGRAD_DIST_TIMEOUT="60")
  assert out.returncode != 0 and "rank 1" in out.stdout + out.stderr and "signal 9" in out.stdout + out.stderr, out.stdout + out.stderr


@needs_mpi
def test_an_exception_on_one_rank_aborts_the_job():
  """A rank ending with an uncaught exception prints it and aborts the job (the others are waiting in a collective)."""
  out = mpirun("raise", limit_s=40, PLUGRAD_DIST_TIMEOUT="60")
  text = out.stdout + out.stderr
  assert out.returncode != 0 and "ValueError: rank 1 fails on purpose" in text and "rank 1 ended with ValueError: aborting the MPI job" in text, text


@needs_mpi
def test_launched_without_mpi4py_is_a_clear_error():
  out = mpirun("no_mpi4py")
  assert out.returncode == 0, out.stdout + out.stderr
  assert out.stdout.count("DistributedError: this process was started by an MPI launcher (world size 2) but mpi4py cannot be imported") == 2
  assert "pip install mpi4py" in out.stdout


@needs_mpi
@pytest.mark.parametrize("example,done", [("train_digits.py", "same predictions"), ("gpt_char.py", "same logits")])
def test_examples_train_data_parallel_under_mpirun(example, done, tmp_path):
  """`mpirun -np 2 python examples/EXAMPLE --distributed --smoke`: each rank trains on half of every batch, rank 0 alone
  prints, saves the checkpoint and checks it reloads."""
  pytest.importorskip("sklearn", reason="examples/train_digits.py needs scikit-learn")
  pytest.importorskip("tqdm", reason="the examples need tqdm")
  weights = tmp_path / "w.safetensors"
  out = mpirun("--distributed", "--smoke", "--weights", str(weights), script=EXAMPLES / example)
  assert out.returncode == 0, out.stdout + out.stderr
  assert out.stdout.count("2 processes") == 1 and out.stdout.count(done) == 1, out.stdout
  assert weights.exists()


# ---------------------------------------------------------------- a world of one (no launcher), in this process

@pytest.fixture
def world_of_one(monkeypatch):
  for k in comm._LAUNCHER_ENV: monkeypatch.delenv(k, raising=False)
  monkeypatch.setattr(comm, "_GROUP", None)


def test_without_a_launcher_the_world_is_one_process(world_of_one):
  dist.init()
  assert (dist.rank(), dist.world_size()) == (0, 1) and dist.is_initialized()
  x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3)).realize()
  for y in (dist.all_reduce(x), dist.all_reduce(x, "mean"), dist.broadcast(x), dist.all_gather(x)):
    assert y.dtype is dtypes.float32 and y.shape == (2, 3) and (y.numpy() == x.numpy()).all()
  y = dist.all_reduce(x)
  x.assign(Tensor(np.zeros((2, 3), np.float32))).realize()
  assert y.numpy().sum() == 15  # a new buffer, not an alias of the input's
  assert dist.all_gather(Tensor(2.0)).numpy().tolist() == [2.0]
  dist.barrier()
  with pytest.raises(dist.DistributedError, match="needs at least 2 processes but was not launched by an MPI launcher.*mpirun -np 2"):
    dist.init(min_world_size=2)


def test_bad_arguments_are_typed_errors(world_of_one):
  x = Tensor([1.0, 2.0])
  with pytest.raises(ValueError, match="op must be one of sum, mean, max, min, prod; got 'avg'"): dist.all_reduce(x, "avg")
  with pytest.raises(TypeError, match="op='mean' needs a float tensor, got int32"): dist.all_reduce(Tensor([1, 2]), "mean")
  with pytest.raises(TypeError, match="a bool tensor reduces with op='max'"): dist.all_reduce(Tensor([True]), "sum")
  with pytest.raises(TypeError, match="needs a Tensor, got a ndarray"): dist.all_reduce(np.ones(2))  # type: ignore[arg-type]
  with pytest.raises(ValueError, match=r"src must be a rank in \[0, 1\), got 1"): dist.broadcast(x, 1)
  with pytest.raises(ValueError, match="axis 1 is out of range for a tensor of shape"): dist.all_gather(x, 1)
  with pytest.raises(ValueError, match="min_world_size must be an int >= 1"): dist.init(min_world_size=0)
  with pytest.raises(TypeError, match="wraps a plugrad.nn.optim.Optimizer"): dist.DistributedOptimizer(object())  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["-1", "inf", "nan", "soon"])
def test_a_bad_timeout_setting_is_a_settings_error(world_of_one, monkeypatch, bad):
  monkeypatch.setenv("PLUGRAD_DIST_TIMEOUT", bad)
  with pytest.raises(SettingsError, match=f"PLUGRAD_DIST_TIMEOUT='{bad}' is not valid"): dist.init()


def test_data_parallel_in_a_world_of_one_is_the_plain_optimizer(world_of_one, tmp_path):
  ws = [Tensor(np.full((3,), 2.0, np.float32), requires_grad=True) for _ in range(2)]
  opt = SGD([ws[0]], lr=0.5)
  dopt = dist.DistributedOptimizer(SGD([ws[1]], lr=0.5))
  for w, o in zip(ws, (opt, dopt)):
    o.zero_grad()
    (w * w).sum().backward()
    o.step()
  assert ws[0].numpy().tolist() == ws[1].numpy().tolist() == [0.0, 0.0, 0.0]
  dist.save_on_rank0({"w": ws[1]}, tmp_path / "w.safetensors")
  assert (tmp_path / "w.safetensors").exists()
