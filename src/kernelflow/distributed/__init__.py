"""Data-parallel execution on torch.distributed."""

from ._comm import all_reduce_sum, broadcast, is_distributed, rank, world_size

__all__ = ["all_reduce_sum", "broadcast", "is_distributed", "rank", "world_size"]
