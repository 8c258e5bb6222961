"""Tensor parallelism over torch.distributed: the group, weight sharding, step broadcast, launch."""
