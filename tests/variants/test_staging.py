"""host_tensor: small index tensors built on the host and placed on the device."""

import torch

from variants.staging import host_tensor


def test_host_tensor_on_cpu():
    t = host_tensor([[1, 2], [3, 4]], torch.long, torch.device("cpu"))
    assert t.dtype == torch.long and t.device.type == "cpu"
    assert t.tolist() == [[1, 2], [3, 4]]
    r = host_tensor(range(3), torch.int32, torch.device("cpu"))
    assert r.dtype == torch.int32 and r.tolist() == [0, 1, 2]
