"""Tensor-level parallelism, where PyTorch keeps it (`torch.distributed.tensor`): `parallel/`."""
