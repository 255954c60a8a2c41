"""What the launchers need to know of the device: its streaming multiprocessor count, read once.

Grid sizes (column tiles, attention splits) aim at a multiple of it. On the CPU, where only
Triton's interpreter runs (in tests), it is 4, so small test shapes still split into tiles."""

import functools

import torch


@functools.cache
def device_sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count
