"""What the launchers need to know of the device, read once: its streaming multiprocessor count
and its compute capability.

Grid sizes (column tiles, attention splits) aim at a multiple of the SM count. On the CPU, where
only Triton's interpreter runs (in tests), it is 4, so small test shapes still split into tiles.
Tiles measured only on one GPU generation are offered by capability."""

import functools

import torch


@functools.cache
def device_sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.cache
def device_capability(device: torch.device) -> tuple:
    if device.type != "cuda":
        return (0, 0)
    return tuple(torch.cuda.get_device_capability(device))
