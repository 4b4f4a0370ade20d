"""Contrastive representation learning: the NT-Xent / InfoNCE loss over two views per example.

COCA (Zhu et al., CIKM 2021, arXiv 2108.10510, §3.2) pre-trains a history encoder this way: two
augmented views of the same behaviour sequence are a positive pair, and every other view in the
batch is a negative (2N − 2 per anchor, as SimCLR), with cosine similarity over a temperature.
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
