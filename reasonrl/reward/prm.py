"""Process rewards for code (Dai et al., arXiv 2410.17621): the lines of a response, and the
binary-search line labels of the paper's Algorithm 1.

A line prefix is *alive* when at least one of K completions sampled from it passes every unit test.
Aliveness is monotone along the program (a prefix nothing can complete is not rescued by more lines),
so the first dead line is found by binary search, ``first_dead_line``: lines before it are labelled 1,
lines from it on 0; a program that passes is all 1.  Labels are stored as feasibility in {0, 1}; the
shaping maps them to the reward scale (docs/algorithms.md, "Process rewards for code").

Lines (the paper leaves the segmentation open): "\\n"-terminated lines of the response's text (no other
line break counts), a blank line merged into the line before it (leading blank lines into the first
line), the last line ending at the last token.  Each line ends at a *line-end token*: the token that
holds its newline (with a tokenizer that merges "\\n" with the next indentation, that token also starts
the next line).  *Neutral* lines are labelled like the others but get no dense reward: comment lines
(``#`` after indentation; the paper's §4.3.3), and, so that text around the program cannot farm the
reward, lines outside the response's fenced code (prose, the fence lines; a response without a fence
is all code) and repeats of an earlier line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Line:
    """One line of a response."""

    text: str  # its characters, newline included (and any blank lines merged into it)
    end_token: int  # index, in the response's tokens, of the token that ends it
    neutral: bool  # a comment, outside the code, or a repeat: labelled like the others, given no dense reward

    def to_json(self) -> list:
        return [self.text, self.end_token, self.neutral]

    @staticmethod
    def from_json(row: Sequence) -> Line:
        text, end_token, neutral = row
        return Line(str(text), int(end_token), bool(neutral))


def token_char_ends(tokenizer, token_ids: Sequence[int]) -> list[int]:
    """For each token, the length of the text the tokens up to it decode to (special tokens skipped)."""
    return [len(tokenizer.decode(token_ids[: i + 1], skip_special_tokens=True)) for i in range(len(token_ids))]


def response_lines(text: str, char_ends: Sequence[int]) -> list[Line]:
    """The lines of a response (module docstring) from its decoded ``text`` and ``token_char_ends``.

    A line whose newline lies in the text of no token (cannot happen with a consistent decode) ends at
    the last token."""
    if not char_ends:
        return []
    pieces = [piece for piece in re.split(r"(?<=\n)", text) if piece]
    lines: list[list] = []  # [text, end_char]
    pending, position = "", 0
    for piece in pieces:
        position += len(piece)
        if not piece.strip():  # blank: merged into the line before (or, at the start, the next one)
            if lines:
                lines[-1][0] += piece
                lines[-1][1] = position
            else:
                pending += piece
            continue
        lines.append([pending + piece, position])
        pending = ""
    if pending and not lines:
        lines.append([pending, position])
    fenced, in_fence, seen, result = "```" in text, False, set(), []
    for line_text, end_char in lines:
        # the token whose text reaches the line's last character (its newline)
        end_token = next((i for i, end in enumerate(char_ends) if end >= end_char), len(char_ends) - 1)
        stripped = line_text.strip()
        fence = "```" in stripped
        code = not fenced or (in_fence and not fence)
        in_fence ^= stripped.count("```") % 2 == 1
        neutral = not code or stripped.startswith("#") or stripped in seen
        seen.add(stripped)
        result.append(Line(line_text, end_token, neutral))
    return result


class DeadLineSearch:
    """The binary search of ``first_dead_line`` as a state machine, so many programs' searches can
    advance together (one engine call samples the completions of many prefixes): ask ``query`` (the
    line prefix to probe, None when done), ``tell`` it whether that prefix is alive, read ``result``."""

    def __init__(self, n_lines: int) -> None:
        self.n_lines = n_lines
        self.low, self.high = 1, n_lines + 1  # the answer is in [low, high]; n_lines + 1 stands for "none"

    @property
    def query(self) -> int | None:
        return (self.low + self.high) // 2 if self.low < self.high else None

    def tell(self, alive: bool) -> None:
        middle = self.query
        if middle is None:
            raise RuntimeError("the search is over: nothing was asked")
        if alive:
            self.low = middle + 1
        else:
            self.high = middle

    @property
    def result(self) -> int | None:
        return None if self.low > self.n_lines else self.low


def first_dead_line(prefix_alive: Callable[[int], bool], n_lines: int) -> int | None:
    """The smallest ℓ in 1..n_lines whose prefix of ℓ lines is dead (``prefix_alive(ℓ)`` False), or None
    when every prefix is alive; ``prefix_alive`` must be monotone (alive at ℓ ⇒ alive before ℓ).

    Binary search over the n_lines + 1 possible answers: ceil(log2(n_lines + 1)) ≤ ceil(log2 n_lines) + 1
    calls (the paper's Algorithm 1 costs K completions per call)."""
    search = DeadLineSearch(n_lines)
    while (line := search.query) is not None:
        search.tell(prefix_alive(line))
    return search.result


def search_calls_at_most(n_lines: int) -> int:
    """The most ``prefix_alive`` calls ``first_dead_line`` makes for ``n_lines`` lines."""
    return math.ceil(math.log2(n_lines + 1)) if n_lines else 0


def line_labels(first_dead: int | None, n_lines: int) -> list[int]:
    """1 for each line before the first dead line, 0 from it on (all 1 when no line is dead)."""
    alive = n_lines if first_dead is None else first_dead - 1
    return [1] * alive + [0] * (n_lines - alive)


# ---------------------------------------------------------------------------------------------- the PRM
# The critic's layout (a backbone + scalar head) regressed onto the line labels (the paper's "simple
# regression loss"): its output at a state estimates the probability that the program can still pass.
# The score of a line prefix is read where the critic reads V(s_t) for the token after the line's end
# token, so a PRM is directly a critic of the same convention (``critic.init=prm`` maps it affinely).


@dataclass(frozen=True)
class LabelledProgram:
    """One labelled program as the PRM reads it."""

    prompt_ids: list[int]
    response_ids: list[int]  # the program's tokens (cut to the response budget) + one EOS
    positions: list[int]  # per kept line: the response position whose state is the line prefix (end token + 1)
    labels: list[int]  # per kept line: 1 alive, 0 dead
    group: str  # the function under test: its programs (from any prompt) stay on one side of the held-out split


def labelled_programs(rows: Sequence[dict], eos_token_id: int, max_prompt_tokens: int, max_response_tokens: int):
    """``prm label`` rows as LabelledPrograms: the prompt's last ``max_prompt_tokens`` tokens, the response's
    first ``max_response_tokens`` − 1 and an EOS; lines whose end falls beyond are dropped."""
    programs = []
    for row in rows:
        response = [*row["response_token_ids"][: max_response_tokens - 1]]
        if response and response[-1] == eos_token_id:
            response = response[:-1]
        kept = [
            (Line.from_json(line).end_token + 1, int(label))
            for line, label in zip(row["lines"], row["labels"], strict=True)
            if Line.from_json(line).end_token < len(response)
        ]
        if kept:
            programs.append(LabelledProgram(
                row["prompt_token_ids"][-max_prompt_tokens:], [*response, eos_token_id],
                [p for p, _ in kept], [y for _, y in kept], str(row["group"]),
            ))  # fmt: skip
    return programs


def prm_line_scores(model, programs: Sequence[LabelledProgram], compute_dtype: torch.dtype) -> Tensor:
    """The PRM's scores at every labelled line of ``programs``, concatenated in order [N lines];
    differentiable when grad mode is on."""
    from reasonrl.batch import pad_rows

    prompts, responses = [p.prompt_ids for p in programs], [p.response_ids for p in programs]
    p_width, r_width = max(map(len, prompts)), max(map(len, responses))
    values = model(
        pad_rows(prompts, p_width, True, torch.long),
        pad_rows([[1] * len(p) for p in prompts], p_width, True, torch.bool),
        pad_rows(responses, r_width, False, torch.long),
        pad_rows([[1] * len(r) for r in responses], r_width, False, torch.bool),
        compute_dtype,
    )  # [B, T]
    return torch.cat([values[i, p.positions] for i, p in enumerate(programs)])


def binary_auc(scores: Sequence[float], labels: Sequence[int]) -> float | None:
    """The area under the ROC curve (the probability a positive outscores a negative, ties ½); None
    without both classes."""
    positives = [s for s, y in zip(scores, labels, strict=True) if y]
    negatives = [s for s, y in zip(scores, labels, strict=True) if not y]
    if not positives or not negatives:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    return wins / (len(positives) * len(negatives))


def prm_metrics(model, programs: Sequence[LabelledProgram], compute_dtype: torch.dtype, batch: int = 8) -> dict:
    """Line-level accuracy (score > ½ agrees with the label), AUC and squared error over ``programs``."""
    scores: list[float] = []
    model.eval()
    with torch.no_grad():
        for start in range(0, len(programs), batch):
            scores += prm_line_scores(model, programs[start : start + batch], compute_dtype).tolist()
    labels = [y for p in programs for y in p.labels]
    n = max(1, len(labels))
    return {
        "lines": len(labels),
        "positive_fraction": sum(labels) / n,
        "line_accuracy": sum((s > 0.5) == bool(y) for s, y in zip(scores, labels, strict=True)) / n,
        "auc": binary_auc(scores, labels),
        "mse": sum((s - y) ** 2 for s, y in zip(scores, labels, strict=True)) / n,
    }


def train_prm(
    model,
    programs: Sequence[LabelledProgram],
    *,
    steps: int,
    batch_programs: int = 8,
    lr: float = 1e-5,
    head_lr: float = 1e-3,
    compute_dtype: torch.dtype = torch.float32,
    seed: int = 0,
    on_step=None,
) -> list[dict[str, float]]:
    """Minimise the mean squared error between the PRM's line scores and the labels for ``steps``
    optimiser steps (the head gets its own, larger learning rate); returns per-step metrics."""
    import random

    from reasonrl.models.optim import apply_gradients

    head = list(model.head.parameters())
    backbone = [p for n, p in model.named_parameters() if not n.startswith("head.")]
    optimizer = torch.optim.AdamW([{"params": backbone, "lr": lr}, {"params": head, "lr": head_lr}], weight_decay=0.0)
    rng, order, history = random.Random(seed), [], []
    model.train()
    for step in range(1, steps + 1):
        if len(order) < batch_programs:
            order += rng.sample(range(len(programs)), len(programs))
        batch, order = [programs[i] for i in order[:batch_programs]], order[batch_programs:]
        scores = prm_line_scores(model, batch, compute_dtype)
        labels = torch.tensor([y for p in batch for y in p.labels], dtype=scores.dtype, device=scores.device)
        loss = torch.nn.functional.mse_loss(scores, labels)
        loss.backward()
        record = {"step": step, "loss": loss.item(), "grad_norm": apply_gradients(model, optimizer, 1.0)}
        history.append(record)
        if on_step is not None:
            on_step(record)
    model.eval()
    return history


class ProcessRewardModel:
    """A trained PRM (`rm train --kind prm`) reading the responses of a rollout batch: the lines of a
    response, and the PRM's score after every number of its tokens."""

    def __init__(self, path: str, tokenizer, compute_dtype: torch.dtype, device: torch.device | str = "cpu") -> None:
        from reasonrl.models.value import load_value_model

        self.model = load_value_model(path).to(device).eval().requires_grad_(False)
        self.tokenizer, self.compute_dtype = tokenizer, compute_dtype

    def lines(self, response_ids: Sequence[int]) -> list[Line]:
        """The lines of one response (module docstring)."""
        text = self.tokenizer.decode(response_ids, skip_special_tokens=True)
        return response_lines(text, token_char_ends(self.tokenizer, response_ids))

    def state_scores(self, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, response_mask: Tensor):
        """[B, T + 1]: column t is the PRM's score of the prompt and the response's first t tokens (an EOS
        is read after each response so that its last token's state has a column)."""
        batch = response_ids.shape[0]
        lengths = response_mask.sum(dim=1)  # [B]
        ids = torch.cat([response_ids, response_ids.new_zeros(batch, 1)], dim=1)  # [B, T + 1]
        mask = torch.cat([response_mask.bool(), response_mask.new_zeros(batch, 1, dtype=torch.bool)], dim=1)
        rows = torch.arange(batch, device=ids.device)
        ids[rows, lengths], mask[rows, lengths] = self.tokenizer.eos_token_id, True
        with torch.no_grad():
            return self.model(prompt_ids, prompt_mask, ids, mask, self.compute_dtype)  # [B, T + 1]
