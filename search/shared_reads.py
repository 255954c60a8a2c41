"""One read of the weight file for all the engines a GPU trial creates.

A screened trial creates an engine for each correctness case and each trace (the full protocol
one per repeat too), and each engine would read the whole checkpoint from disk again. While a
trial's `create_engine` runs, `SharedReads` answers the engine's `torch.load(path,
map_location="cpu", weights_only=True)` and `safetensors.torch.load_file(path, device="cpu")`
from the first such read of that file (a new dict over the same CPU tensors each time). The
written engine is unchanged, and an engine a user creates reads from disk as before; the judge's
own reads are not served (only engine creation is wrapped).

The kept read of a torch file is memory-mapped (copy-on-write: the file is never written). An
engine copies what it reads onto the GPU, so engines never hold the kept tensors; one that changed
a kept tensor in place (its version counter moved) makes the next engine read the file again.
Engines on a CPU are not served: there `.to("cpu")` may return the kept tensor itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import contextmanager

import torch

__all__ = ["SharedReads"]


class SharedReads:
    """`devices`: the device types whose engines are served (a test serves CPU engines to see
    a real engine's reads go through it)."""

    def __init__(self, devices: tuple[str, ...] = ("cuda",)):
        self.devices = devices
        self._kept: dict[tuple, tuple[dict, dict]] = {}  # key -> (state, version of each tensor)
        self.hits = 0
        self.reads = 0
        self._real_torch_load = torch.load

    def wrap(self, create_engine: Callable) -> Callable:
        """`create_engine` with its weight reads served from the kept ones (on a GPU)."""

        def create(config, weight_dir, device, *args, **kwargs):
            if torch.device(device).type not in self.devices:
                return create_engine(config, weight_dir, device, *args, **kwargs)
            with self._serving():
                return create_engine(config, weight_dir, device, *args, **kwargs)

        return create

    @contextmanager
    def _serving(self):
        patched = [(torch, "load", self._torch_load)]
        try:
            import safetensors.torch as st

            patched.append((st, "load_file", self._safetensors_load_file(st.load_file)))
        except ImportError:
            pass
        saved = [(module, name, getattr(module, name)) for module, name, _ in patched]
        for module, name, replacement in patched:
            setattr(module, name, replacement)
        try:
            yield
        finally:
            for module, name, original in saved:
                setattr(module, name, original)

    def _torch_load(self, f, *args, **kwargs):
        plain = not args and kwargs == {"map_location": "cpu", "weights_only": True}
        if not plain or not isinstance(f, (str, os.PathLike)):
            return self._real_torch_load(f, *args, **kwargs)
        return self._served(("torch.load", f), lambda: self._mapped_torch_load(f, kwargs))

    def _mapped_torch_load(self, f, kwargs: dict) -> dict:
        """The kept read memory-maps the file: its pages come from the page cache as each
        engine copies them, where a plain read copied the whole file into memory first.
        (A file torch.save wrote before the zip format cannot be mapped: read plainly.)"""
        try:
            return self._real_torch_load(f, mmap=True, **kwargs)
        except RuntimeError:
            return self._real_torch_load(f, **kwargs)

    def _safetensors_load_file(self, load_file: Callable) -> Callable:
        def served(filename, device="cpu"):
            if device != "cpu" or not isinstance(filename, (str, os.PathLike)):
                return load_file(filename, device=device)
            return self._served(("load_file", filename), lambda: load_file(filename, device="cpu"))

        return served

    def _served(self, how: tuple, read: Callable) -> dict:
        kind, path = how
        stat = os.stat(path)
        key = (kind, os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
        kept = self._kept.get(key)
        if kept is not None:
            state, versions = kept
            if all(t._version == versions[k] for k, t in state.items()):
                self.hits += 1
                return dict(state)
            del self._kept[key]  # changed in place by an engine: read it again
        state = read()
        self.reads += 1
        if isinstance(state, dict) and all(isinstance(t, torch.Tensor) for t in state.values()):
            self._kept[key] = (dict(state), {k: t._version for k, t in state.items()})
            return dict(state)
        return state
