"""The SM count the launchers size their grids by, and the capability that picks tiles."""

import pytest
import torch

from variants.kernels.device import device_capability, device_sm_count


def test_cpu_counts_four():
    assert device_sm_count(torch.device("cpu")) == 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_counts_its_multiprocessors():
    device = torch.device("cuda", 0)
    assert device_sm_count(device) == torch.cuda.get_device_properties(0).multi_processor_count


def test_cpu_capability_is_none_of_the_gpus():
    assert device_capability(torch.device("cpu")) == (0, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_capability_is_the_devices():
    device = torch.device("cuda", 0)
    assert device_capability(device) == tuple(torch.cuda.get_device_capability(0))
