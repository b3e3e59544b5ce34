"""Training on several processes and hosts: collectives on Tensors over MPI (mpi4py), and data-parallel training
(docs/distributed.md). Tensors sharded over several devices of one process are plugrad.tensor's (docs/sharding.md).

  mpirun -np 2 python train.py        # each process: import plugrad.distributed as dist; dist.init(); ...
"""
from plugrad.distributed.comm import (
  OPS,
  DistributedError,
  DistributedTimeoutError,
  all_gather,
  all_reduce,
  all_reduce_many,
  barrier,
  broadcast,
  init,
  is_initialized,
  rank,
  world_size,
)
from plugrad.distributed.data_parallel import DistributedOptimizer, broadcast_parameters, save_on_rank0

__all__ = ["OPS", "DistributedError", "DistributedOptimizer", "DistributedTimeoutError", "all_gather", "all_reduce", "all_reduce_many", "barrier",
           "broadcast", "broadcast_parameters", "init", "is_initialized", "rank", "save_on_rank0", "world_size"]
