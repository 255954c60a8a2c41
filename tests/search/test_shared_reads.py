"""A GPU trial's engines share one read of the weight file; a changed read is read again; CPU
engines, other calls and the judge's reads go to disk."""

import json
from pathlib import Path

import pytest
import torch

from search.shared_reads import SharedReads


def engine_reading(path, log):
    """A stand-in engine: reads the checkpoint as the written engines do, takes what it needs."""

    def create_engine(config, weight_dir, device):
        state = torch.load(path, map_location="cpu", weights_only=True)
        log.append(state)
        return {name: state.pop(name).clone() for name in list(state)}

    return create_engine


def checkpoint(tmp_path):
    path = tmp_path / "model.pt"
    torch.save({"w": torch.arange(4.0), "b": torch.ones(2)}, path)
    return path


def test_a_gpu_trials_engines_read_the_file_once(tmp_path):
    path, log, reads = checkpoint(tmp_path), [], SharedReads()
    create = reads.wrap(engine_reading(path, log))
    first, second = create({}, str(tmp_path), "cuda"), create({}, str(tmp_path), "cuda:0")
    assert (reads.reads, reads.hits) == (1, 1)
    assert torch.equal(first["w"], second["w"]) and torch.equal(second["b"], torch.ones(2))
    assert log[0] is not log[1]  # each engine its own dict: the first's pops left the second's
    assert torch.load is torch.serialization.load  # restored once the engine is made


def test_a_tensor_changed_in_place_is_read_again(tmp_path):
    path, log, reads = checkpoint(tmp_path), [], SharedReads()

    def careless(config, weight_dir, device):
        state = torch.load(path, map_location="cpu", weights_only=True)
        state["w"].mul_(10)  # on the kept tensor itself
        return state

    reads.wrap(careless)({}, str(tmp_path), "cuda")
    engine = reads.wrap(engine_reading(path, log))({}, str(tmp_path), "cuda")
    assert reads.reads == 2 and reads.hits == 0
    assert torch.equal(engine["w"], torch.arange(4.0))  # the file's values, not the changed ones


def test_a_rewritten_file_is_read_again(tmp_path):
    path, log, reads = checkpoint(tmp_path), [], SharedReads()
    create = reads.wrap(engine_reading(path, log))
    create({}, str(tmp_path), "cuda")
    torch.save({"w": torch.zeros(5), "b": torch.ones(2)}, path)
    assert create({}, str(tmp_path), "cuda")["w"].shape == (5,)
    assert reads.reads == 2


def test_cpu_engines_and_other_reads_go_to_disk(tmp_path):
    path, log, reads = checkpoint(tmp_path), [], SharedReads()
    create = reads.wrap(engine_reading(path, log))
    create({}, str(tmp_path), "cpu")
    create({}, str(tmp_path), "cpu")
    assert (reads.reads, reads.hits) == (0, 0)

    def mapped(config, weight_dir, device):
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)

    reads.wrap(mapped)({}, str(tmp_path), "cuda")
    reads.wrap(mapped)({}, str(tmp_path), "cuda")
    assert (reads.reads, reads.hits) == (0, 0)
    # outside an engine's creation (the judge's reads) torch.load is torch's own
    assert torch.load(path, map_location="cpu", weights_only=True)["w"].sum() == 6


def test_safetensors_reads_are_shared(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "model.safetensors"
    save_file({"w": torch.arange(3.0)}, str(path))
    reads = SharedReads()

    def create_engine(config, weight_dir, device):
        from safetensors.torch import load_file

        return load_file(str(path), device="cpu")

    create = reads.wrap(create_engine)
    assert torch.equal(create({}, "", "cuda")["w"], create({}, "", "cuda")["w"])
    assert (reads.reads, reads.hits) == (1, 1)


@pytest.mark.parametrize("checkpoint_kind", ["course model.pt", "transformers safetensors"])
def test_a_written_engines_reads_go_through_it(
    checkpoint_kind, slab_engine_file, tiny_config, tiny_weights, held_out
):
    """A rendered engine's reader is what SharedReads answers: two engines, one read, the same
    logits as an engine that read the file itself (CPU engines served here to see it)."""
    from evaluator.engine_loader import load_engine_module

    if checkpoint_kind == "course model.pt":
        config, weight_dir = tiny_config, tiny_weights
    else:
        weight_dir = str(held_out("qwen2"))
        config = json.loads((Path(weight_dir) / "config.json").read_text())
    create_engine = load_engine_module(slab_engine_file).create_engine
    reads = SharedReads(devices=("cpu",))
    served = reads.wrap(create_engine)
    prompt = [torch.arange(1, 9) % config["vocab_size"]]
    with torch.no_grad():
        outs = [served(config, weight_dir, "cpu").prefill([1], prompt) for _ in range(2)]
        plain = create_engine(config, weight_dir, "cpu").prefill([1], prompt)
    assert (reads.reads, reads.hits) == (1, 1)
    assert torch.equal(outs[0], plain) and torch.equal(outs[1], plain)
