"""Contrastive representation learning: the NT-Xent / InfoNCE loss over two views per example.

COCA (Zhu et al., CIKM 2021, arXiv 2108.10510, §3.2) pre-trains a history encoder this way: two
augmented views of the same behaviour sequence are a positive pair, and every other view in the
batch is a negative (2N − 2 per anchor, as SimCLR), with cosine similarity over a temperature.
Image-text contrastive learning (CLIP, arXiv 2103.00020, Fig. 3; the second stage of Seed1.5-VL's
vision encoder, arXiv 2505.07062 §3.1) pairs the two modalities only: each image's caption is its
positive, the batch's other captions its negatives, and the same for each caption.
Pure torch; shapes in comments.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def info_nce(view_a: Tensor, view_b: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    """L = mean over the 2N anchors of −log softmax_j(cos(z_i, z_j)/τ)[positive], j ≠ i (COCA eq. 5).

    view_a, view_b: [N, d] representations of the two views of N examples -> (loss [], accuracy []):
    accuracy is the share of anchors whose most similar other view is their positive.
    """
    n = view_a.shape[0]
    z = F.normalize(torch.cat([view_a, view_b]).float(), dim=-1)  # [2N, d]
    logits = z @ z.T / temperature  # [2N, 2N]
    logits = logits.masked_fill(torch.eye(2 * n, dtype=torch.bool, device=z.device), float("-inf"))  # no self-pair
    positives = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]).to(z.device)  # [2N]
    loss = F.cross_entropy(logits, positives)
    accuracy = (logits.argmax(-1) == positives).float().mean()
    return loss, accuracy


def image_text_contrastive(images: Tensor, texts: Tensor, logit_scale: Tensor) -> tuple[Tensor, Tensor]:
    """L = ½·(CE(s·cos(I, T), diag) + CE(s·cos(T, I), diag)), CLIP's symmetric loss (arXiv 2103.00020, Fig. 3).

    images, texts: [N, d], row i of each the same example; logit_scale: [] s (1/temperature)
    -> (loss [], accuracy []): accuracy is the share of images whose most similar caption is their own.
    """
    logits = logit_scale * F.normalize(images.float(), dim=-1) @ F.normalize(texts.float(), dim=-1).T  # [N, N]
    target = torch.arange(images.shape[0], device=logits.device)  # [N]
    loss = (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2
    return loss, (logits.argmax(-1) == target).float().mean()
