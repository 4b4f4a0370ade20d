"""InfoNCE (COCA's contrastive loss) on hand-computed batches."""

import math

import pytest
import torch

from reasonrl.algo.contrastive import info_nce


def test_info_nce_by_hand():
    views = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    loss, accuracy = info_nce(views, views * 3.0, temperature=1.0)  # cosine: the scale does not matter
    # every anchor: its positive at cos 1, the two other views at cos 0
    assert loss.item() == pytest.approx(math.log(1 + 2 / math.e))
    assert accuracy.item() == 1.0


def test_info_nce_temperature_and_a_confused_batch():
    a = torch.tensor([[1.0, 0.0], [1.0, 0.0]])  # both examples look the same: the positive is a coin flip
    loss, _ = info_nce(a, a.clone(), temperature=0.5)
    # anchor 0: views 1, 2, 3 all at cos 1 -> −log(1/3)
    assert loss.item() == pytest.approx(math.log(3))
    sharp, _ = info_nce(torch.eye(3), torch.eye(3), temperature=0.1)
    soft, _ = info_nce(torch.eye(3), torch.eye(3), temperature=1.0)
    assert sharp.item() < soft.item()
