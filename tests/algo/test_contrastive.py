"""InfoNCE (COCA's contrastive loss) and CLIP's image-text loss on hand-computed batches."""

import math

import pytest
import torch

from reasonrl.algo.contrastive_losses import image_text_contrastive, info_nce


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


def test_image_text_contrastive_by_hand():
    images = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    texts = torch.tensor([[3.0, 0.0], [1.0, 1.0]])  # caption 1 at 45° from both images
    loss, accuracy = image_text_contrastive(images, texts, torch.tensor(2.0))
    c = 1 / math.sqrt(2)  # cos(image 0, text 1) = cos(image 1, text 1) = c; cos(image 1, text 0) = 0
    image_rows = math.log(1 + math.exp(2 * (c - 1))) + math.log(1 + math.exp(-2 * c))
    text_rows = math.log(1 + math.exp(-2)) + math.log(1 + math.exp(0))
    assert loss.item() == pytest.approx((image_rows + text_rows) / 4)
    assert accuracy.item() == 1.0  # each image's nearest caption is its own (ties aside)
    # the modalities only meet each other: an image is never its own caption's negative, nor another image
    same, _ = image_text_contrastive(torch.eye(2), torch.eye(2), torch.tensor(1.0))
    assert same.item() == pytest.approx(math.log(1 + math.exp(-1)))
