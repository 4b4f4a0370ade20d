"""Files from others run no code when reasonrl loads them: checkpoints (one process and DCP shards), the
offline reference cache, model directories with pickled weights, GGUF files, data files."""

import pickle

import numpy as np
import pytest
import torch

from reasonrl.cli import main
from reasonrl.models.model_error import ModelError
from reasonrl.models.untrusted import TRUST_PICKLE_ENV, UnsafeFileError, load_tensor_file, safe_dcp_load
from tests.train.test_loop import TINY


class RunsCode:
    """Unpickling this creates ``marker``: what any code a hostile file chose could do instead."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    overrides = [*TINY, "train.rollout_steps=1", "run.save_every=1", f"run.output_dir={root}", "run.name=tiny"]
    assert main(["train", "grpo", *overrides, "--quiet"]) == 0
    return root / "tiny"


def test_a_checkpoint_is_plain_data_that_a_weights_only_load_reads(run_dir):
    trainer = torch.load(run_dir / "checkpoints" / "step-000001" / "trainer.pt", weights_only=True)
    assert {"optimizer", "scheduler", "rng"} <= set(trainer)


def test_resuming_a_checkpoint_whose_trainer_state_runs_code_is_refused_naming_the_file(run_dir, tmp_path, capsys):
    marker = tmp_path / "ran"
    trainer_file = run_dir / "checkpoints" / "step-000001" / "trainer.pt"
    original = trainer_file.read_bytes()
    try:
        torch.save({"optimizer": RunsCode(marker), "scheduler": {}, "rng": {}}, trainer_file)
        assert main(["train", "--resume", str(run_dir), "train.rollout_steps=2", "--quiet"]) == 1
    finally:
        trainer_file.write_bytes(original)
    err = capsys.readouterr().err
    assert not marker.exists()
    assert f"refusing to load {trainer_file}" in err and "GLOBAL io.open" in err and "Traceback" not in err


def test_a_checkpoint_written_before_plain_rng_state_still_loads(tmp_path):
    # the NumPy RNG state of older checkpoints is an array: admitted by its constructors alone
    legacy = {"rng": {"numpy": np.random.get_state(), "python": (3, tuple(range(625)), None)}}
    torch.save(legacy, tmp_path / "trainer.pt")
    loaded = load_tensor_file(tmp_path / "trainer.pt")
    assert np.array_equal(loaded["rng"]["numpy"][1], legacy["rng"]["numpy"][1])


def test_a_damaged_tensor_file_is_one_error_naming_it(tmp_path):
    (tmp_path / "trainer.pt").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ModelError, match=rf"{tmp_path / 'trainer.pt'} is damaged or not a torch file"):
        load_tensor_file(tmp_path / "trainer.pt")


def _sharded(tmp_path):
    """A DCP checkpoint of a small module and its optimiser, as a data-parallel run writes it (one process)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    module = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)
    module(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    weights, optim = get_state_dict(module, optimizer)
    dcp.save({"policy": weights, "policy_optimizer": optim}, checkpoint_id=tmp_path / "shards")
    fresh = torch.nn.Linear(3, 2)
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    fresh_weights, fresh_optim = get_state_dict(fresh, fresh_optimizer)
    return module, {"policy": fresh_weights, "policy_optimizer": fresh_optim}


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_sharded_checkpoints_load_their_tensors_without_unpickling_code(tmp_path):
    module, state = _sharded(tmp_path)
    safe_dcp_load(state, tmp_path / "shards")
    assert torch.equal(state["policy"]["weight"], module.weight.detach())
    assert state["policy_optimizer"]["param_groups"][0]["lr"] == 1e-3  # a non-tensor item, read weights-only

    marker = tmp_path / "ran"
    (tmp_path / "shards" / ".metadata").write_bytes(pickle.dumps(RunsCode(marker)))
    with pytest.raises(UnsafeFileError, match=r"not a torch\.distributed\.checkpoint metadata file"):
        safe_dcp_load(state, tmp_path / "shards")
    assert not marker.exists()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_sharded_checkpoints_pickled_item_is_refused(tmp_path):
    import torch.distributed.checkpoint as dcp

    marker = tmp_path / "ran"
    dcp.save({"extra": RunsCode(marker)}, checkpoint_id=tmp_path / "shards")
    with pytest.raises(UnsafeFileError, match="refusing to load the checkpoint item extra"):
        safe_dcp_load({"extra": None}, tmp_path / "shards")
    assert not marker.exists()


def test_a_model_directory_with_only_pickled_weights_is_refused_unless_named(tmp_path, monkeypatch):
    from reasonrl.models.load import load_model, resolve_model

    directory = tmp_path / "pickled"
    model = load_model("tiny-random")
    model.save_pretrained(directory, safe_serialization=False)
    if not (directory / "pytorch_model.bin").exists():  # transformers 5 may save safetensors regardless
        (directory / "model.safetensors").unlink()
        torch.save(model.state_dict(), directory / "pytorch_model.bin")
    assert not list(directory.glob("*.safetensors"))
    with pytest.raises(UnsafeFileError, match=rf"refusing to load {directory}: its weights are pickled"):
        load_model(str(directory))
    monkeypatch.setenv(TRUST_PICKLE_ENV, str(directory))
    trusted = load_model(str(directory))
    assert torch.equal(trusted.lm_head.weight, model.lm_head.weight)
    assert resolve_model(str(directory)) == str(directory)


def test_a_malformed_gguf_file_is_one_error_naming_it(tmp_path, monkeypatch):
    from reasonrl.models.load import load_model

    monkeypatch.setenv("REASONRL_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "broken.gguf"
    gguf.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)
    with pytest.raises(ModelError, match=rf"{gguf}: not a readable GGUF checkpoint"):
        load_model(str(gguf))


def test_the_offline_reference_cache_runs_no_code(tmp_path):
    marker = tmp_path / "ran"
    torch.save({"fingerprint": RunsCode(marker), "logprobs": []}, tmp_path / "reference.pt")
    with pytest.raises(UnsafeFileError):
        load_tensor_file(tmp_path / "reference.pt")
    assert not marker.exists()
