"""Pairwise generative reward model (Pairwise-RL, arXiv 2504.04950).

Any causal LM is the judge: it reads (question, response A, response B) through a template and
its next-token logits for the two verdict letters give P(A ≻ B) = σ(logit_A − logit_B).  No new
head: the verdict comes out of the LM head, which is the point of a *generative* RM.  Training is
cross-entropy on human pairs shown in both orders (position debiasing); at RL time the reward of
a sample y against an anchor y_ref is the position-debiased win probability (0.5 = parity).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from reasonrl.algo.preference import pairwise_judge_loss, position_debiased_reward, verdict_probability
from reasonrl.batch import pad_rows
from reasonrl.data.prompts import chat_token_ids, text_token_ids
from reasonrl.models.forward import autocast_context
from reasonrl.models.optim import apply_gradients

PAIRWISE_TEMPLATE = (
    "Compare two responses to the same request.\n\n[Request]\n{question}\n\n[Response A]\n{first}\n\n"
    "[Response B]\n{second}\n\nWhich response is better? Reply with one letter: A or B."
)


class PairwiseJudge:
    """P(first ≻ second | question) from a causal LM's verdict-token logits."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        *,
        template: str = PAIRWISE_TEMPLATE,
        verdict_tokens: tuple[str, str] = ("A", "B"),
        max_text_tokens: int = 160,
        compute_dtype: torch.dtype = torch.float32,
    ) -> None:
        self.model, self.tokenizer, self.template = model, tokenizer, template
        self.max_text_tokens, self.compute_dtype = max_text_tokens, compute_dtype
        ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in verdict_tokens]
        if any(len(i) != 1 for i in ids) or ids[0] == ids[1]:
            raise ValueError(f"verdict tokens {verdict_tokens} must be two distinct single tokens of the judge")
        self.verdict_ids = (ids[0][0], ids[1][0])

    def _clip(self, text: str) -> str:
        ids = text_token_ids(self.tokenizer, text)
        return text if len(ids) <= self.max_text_tokens else self.tokenizer.decode(ids[: self.max_text_tokens]) + " …"

    def encode(self, question: str, first: str, second: str) -> list[int]:
        """The judge prompt's ids (chat template, ending at the assistant header); what the texts spell stays
        text, so a response cannot close the judge's turn and write its verdict."""
        content = self.template.format(
            question=self._clip(question), first=self._clip(first), second=self._clip(second)
        )
        return chat_token_ids(self.tokenizer, [{"role": "user", "content": content}])

    def verdict_logits(self, rows: Sequence[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(logit of the first verdict token, of the second) at the end of each prompt: [N], [N]."""
        width = max(map(len, rows))
        device = self.model.get_output_embeddings().weight.device
        ids = pad_rows(rows, width, True, torch.long).to(device)
        mask = pad_rows([[1] * len(r) for r in rows], width, True, torch.long).to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with autocast_context(self.compute_dtype, ids.device):
            hidden = self.model.base_model(input_ids=ids, attention_mask=mask, position_ids=positions).last_hidden_state
            # only the last position's two verdict logits: no [N, L, V] logits tensor
            weight = self.model.get_output_embeddings().weight[list(self.verdict_ids)]  # [2, d]
            logits = hidden[:, -1].float() @ weight.float().T  # [N, 2]
        return logits[:, 0], logits[:, 1]

    def preference(self, questions: Sequence[str], first: Sequence[str], second: Sequence[str], batch_size: int = 8):
        """P(first ≻ second) for each triple, without gradients: [N]."""
        out = []
        with torch.no_grad():
            for start in range(0, len(questions), batch_size):
                rows = [
                    self.encode(q, a, b)
                    for q, a, b in zip(
                        *(x[start : start + batch_size] for x in (questions, first, second)), strict=True
                    )
                ]
                out.append(verdict_probability(*self.verdict_logits(rows)))
        return torch.cat(out).cpu() if out else torch.zeros(0)

    def debiased_reward(
        self, questions: Sequence[str], responses: Sequence[str], anchors: Sequence[str]
    ) -> torch.Tensor:
        """R(y, y_ref) = ½·[P(y ≻ y_ref | y first) + 1 − P(y_ref ≻ y | y_ref first)] in [0, 1]: [N]."""
        return position_debiased_reward(
            self.preference(questions, responses, anchors), self.preference(questions, anchors, responses)
        )


def train_pairwise_judge(
    judge: PairwiseJudge,
    pairs: Sequence[tuple[str, str, str]],  # (question, chosen, rejected)
    *,
    steps: int,
    batch_pairs: int = 4,
    lr: float = 1e-5,
    seed: int = 0,
    on_step=None,
) -> list[float]:
    """Cross-entropy on the verdict, each pair shown in both orders (chosen as A, then as B).  Returns losses;
    ``on_step`` is told each step's ``{"step", "loss"}``."""
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(judge.model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    judge.model.train()
    for step in range(1, steps + 1):
        batch = rng.sample(list(pairs), min(batch_pairs, len(pairs)))
        rows = [judge.encode(q, c, r) for q, c, r in batch] + [judge.encode(q, r, c) for q, c, r in batch]
        logit_a, logit_b = judge.verdict_logits(rows)
        labels = torch.tensor([True] * len(batch) + [False] * len(batch), device=logit_a.device)
        loss = pairwise_judge_loss(logit_a, logit_b, labels)
        loss.backward()
        apply_gradients(judge.model, optimizer, 1.0)
        losses.append(loss.item())
        if on_step is not None:
            on_step({"step": step, "loss": losses[-1]})
    judge.model.eval()
    return losses
