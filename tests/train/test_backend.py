"""The training backends: a checkpoint is continued only by the kind of backend that wrote it."""

import json

import pytest

from reasonrl.config import ConfigError
from reasonrl.training.backend import FSDP2Ranks, SingleProcess
from reasonrl.training.placement.parallel import DataParallel


def test_a_checkpoint_is_resumed_only_by_the_backend_that_wrote_it_and_the_refusal_names_the_command(tmp_path):
    checkpoint = tmp_path / "checkpoints" / "step-000001"
    checkpoint.mkdir(parents=True)
    rank = FSDP2Ranks(DataParallel(rank=0, world_size=2))  # no collective runs before the models load
    (checkpoint / "state.json").write_text(json.dumps({"step": 1}))  # one process's
    SingleProcess().check_resumable(tmp_path)
    with pytest.raises(ConfigError, match=r"written by one process; resume it without torchrun: reasonrl train"):
        rank.check_resumable(tmp_path)
    (checkpoint / "state.json").write_text(json.dumps({"step": 1, "world_size": 2}))  # torchrun's two ranks'
    rank.check_resumable(tmp_path)
    with pytest.raises(ConfigError, match=r"written by 2 data-parallel .* torchrun --standalone --nproc-per-node 2"):
        SingleProcess().check_resumable(tmp_path)
