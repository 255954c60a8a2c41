"""What this machine is: GPU, driver, torch, CUDA, triton, Python (for the results log)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def describe_environment(device: str) -> dict:
    import torch

    env = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "device": device,
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "triton": _version("triton") or _version("pytorch-triton"),
        "optuna": _version("optuna"),
    }
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        index = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(index)
        env["gpu"] = props.name
        env["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        env["compute_capability"] = f"{props.major}.{props.minor}"
        env["gpu_count"] = torch.cuda.device_count()
        env["driver"] = _driver()
        env["cudnn"] = torch.backends.cudnn.version()
    else:
        env["gpu"] = None
    return env
