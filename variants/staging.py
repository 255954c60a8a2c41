"""Host-to-device staging for the small per-call index tensors (positions, slots, tables).

On CUDA a copy from pageable memory synchronises the stream; pinned memory from PyTorch's caching
host allocator with `non_blocking=True` does not, and the allocator keeps the block alive until
the copy has run."""

import torch


def host_tensor(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    t = torch.tensor(values, dtype=dtype)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)
