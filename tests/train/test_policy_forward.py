"""The chunked log-prob/entropy forward equals the plain full-logits computation."""

import pytest
import torch

from reasonrl.models.load import load_model
from reasonrl.training.update.policy import response_logprobs


@pytest.fixture(scope="module")
def model():
    return load_model("tiny-random")


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    prompt_lens, response_lens = [5, 3, 7], [6, 2, 4]
    P, T = max(prompt_lens), max(response_lens)
    prompt_ids = torch.zeros(3, P, dtype=torch.long)
    prompt_mask = torch.zeros(3, P, dtype=torch.bool)
    response_ids = torch.zeros(3, T, dtype=torch.long)
    response_mask = torch.zeros(3, T, dtype=torch.bool)
    for i, (p, t) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        prompt_ids[i, P - p :] = torch.randint(3, 250, (p,), generator=g)
        prompt_mask[i, P - p :] = True
        response_ids[i, :t] = torch.randint(3, 250, (t,), generator=g)
        response_mask[i, :t] = True
    return prompt_ids, prompt_mask, response_ids, response_mask


def reference(model, prompt_ids, prompt_mask, response_ids, response_mask, temperature):
    """Row by row, unpadded, with full logits."""
    out_lp = torch.zeros(response_ids.shape)
    out_ent = torch.zeros(response_ids.shape)
    for i in range(prompt_ids.shape[0]):
        ids = torch.cat([prompt_ids[i][prompt_mask[i]], response_ids[i][response_mask[i]]])[None]
        logits = model(ids).logits[0].float() / temperature
        p = int(prompt_mask[i].sum())
        t = int(response_mask[i].sum())
        logp = torch.log_softmax(logits[p - 1 : p - 1 + t], -1)
        out_lp[i, :t] = logp.gather(-1, ids[0, p:, None]).squeeze(-1)
        out_ent[i, :t] = -(logp.exp() * logp).sum(-1)
    return out_lp, out_ent


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("chunk_tokens", [1, 4, 512])
def test_matches_full_logits_reference(model, temperature, chunk_tokens):
    inputs = batch()
    lp, ent = response_logprobs(model, *inputs, temperature=temperature, chunk_tokens=chunk_tokens)
    ref_lp, ref_ent = reference(model, *inputs, temperature)
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)
    assert torch.all(lp[~inputs[3]] == 0)


def test_gradients_match_the_reference(model):
    inputs = batch(1)
    weights = torch.randn(inputs[3].shape)
    model.zero_grad()
    lp, _ = response_logprobs(model, *inputs, chunk_tokens=3)
    (lp * weights).sum().backward()
    chunked = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    ref_lp, _ = reference(model, *inputs, 1.0)
    (ref_lp * weights).sum().backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(chunked[name], param.grad, atol=1e-5, rtol=1e-4, msg=name)
    model.zero_grad()


def test_extra_padding_changes_nothing(model):
    prompt_ids, prompt_mask, response_ids, response_mask = batch(2)
    padded = (
        torch.cat([torch.zeros(3, 4, dtype=torch.long), prompt_ids], 1),
        torch.cat([torch.zeros(3, 4, dtype=torch.bool), prompt_mask], 1),
        torch.cat([response_ids, torch.full((3, 5), 2)], 1),
        torch.cat([response_mask, torch.zeros(3, 5, dtype=torch.bool)], 1),
    )
    with torch.no_grad():
        lp, _ = response_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask)
        lp_padded, _ = response_logprobs(model, *padded)
    torch.testing.assert_close(lp_padded[:, : lp.shape[1]], lp, atol=1e-5, rtol=1e-5)


def test_a_head_mask_computes_only_its_tokens_and_changes_nothing_there(model, monkeypatch):
    import reasonrl.training.update.policy as policy

    inputs = batch(3)
    head_mask = torch.zeros_like(inputs[3])
    head_mask[0, 3:] = True  # a later window of row 0
    head_mask[2, :2] = True
    head_mask[1, 5] = True  # outside row 1's response: ignored
    calls = []
    head = policy.token_logprobs
    monkeypatch.setattr(
        policy, "token_logprobs", lambda hidden, *a, **k: calls.append(len(hidden)) or head(hidden, *a, **k)
    )
    with torch.no_grad():
        full_lp, full_ent = response_logprobs(model, *inputs)
        lp, ent = response_logprobs(model, *inputs, head_mask=head_mask)
    assert calls == [int(inputs[3].sum()), 3 + 2]  # the LM head ran on the masked tokens only
    kept = head_mask & inputs[3]
    torch.testing.assert_close(lp[kept], full_lp[kept], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ent[kept], full_ent[kept], atol=1e-6, rtol=1e-6)
    assert torch.all(lp[~kept] == 0) and torch.all(ent[~kept] == 0)


def test_an_empty_head_mask_still_backpropagates(model):
    # a data-parallel filler micro-batch: no loss token, but its backward must run like the other ranks'
    inputs = batch(4)
    model.zero_grad()
    lp, ent = response_logprobs(model, *inputs, head_mask=torch.zeros_like(inputs[3]))
    assert torch.count_nonzero(lp) == 0 and lp.requires_grad
    (lp.sum() + ent.sum()).backward()
    assert all(p.grad is not None and torch.count_nonzero(p.grad) == 0 for p in model.parameters())
    model.zero_grad()
