"""The chunked LM head (models/logprob_head.py) computes what a plain log-softmax over the whole vocabulary
computes (every row's logits at once): log-probs, entropy and every gradient, in fp32 to 1e-5, and in bf16
compute to bf16's rounding."""

import pytest
import torch

from reasonrl.models.logprob_head import token_logprobs

VOCAB, WIDTH, ROWS = 97, 24, 37


def plain_head(hidden, head, targets, temperature=1.0, suppressed=()):
    """The reference: every row's [V] logits at once, PyTorch's logsumexp and softmax, autograd's gradients; a
    suppressed token's column left out of the distribution (the targets renumbered)."""
    logits = head(hidden).float() / temperature  # [N, V]
    if suppressed:
        kept = [v for v in range(logits.shape[1]) if v not in suppressed]
        logits, targets = logits[:, kept], torch.tensor([kept.index(t) for t in targets.tolist()])
    normaliser = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(-1, targets[:, None]).squeeze(-1) - normaliser
    return logprobs, normaliser - (torch.softmax(logits, dim=-1) * logits).sum(-1)


def case(bias: bool, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(WIDTH, VOCAB, bias=bias)
    with torch.no_grad():
        head.weight.copy_(torch.randn(VOCAB, WIDTH, generator=generator) * 0.3)
        if bias:
            head.bias.copy_(torch.randn(VOCAB, generator=generator))
    hidden = torch.randn(ROWS, WIDTH, generator=generator, requires_grad=True)
    targets = torch.randint(0, VOCAB, (ROWS,), generator=generator)
    return head, hidden, targets


def gradients(outputs, head, hidden, weights):
    """The gradients of Σ w_lp·log-prob + w_H·entropy (random weights per row) for the hidden states and the head."""
    head.zero_grad()
    hidden.grad = None
    ((outputs[0] * weights[0]).sum() + (outputs[1] * weights[1]).sum()).backward()
    return [hidden.grad.clone(), head.weight.grad.clone(), *([head.bias.grad.clone()] if head.bias is not None else [])]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_tokens", [8, 512])
def test_the_chunked_head_equals_a_plain_log_softmax_with_its_gradients(bias, temperature, chunk_tokens):
    head, hidden, targets = case(bias)
    weights = torch.randn(2, ROWS, generator=torch.Generator().manual_seed(1))
    chunked = token_logprobs(hidden, head, targets, temperature, chunk_tokens=chunk_tokens)
    plain = plain_head(hidden, head, targets, temperature)
    for mine, theirs in zip(chunked, plain, strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)
    grads = gradients(chunked, head, hidden, weights), gradients(plain, head, hidden, weights)
    for mine, theirs in zip(*grads, strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)


def test_suppressed_tokens_are_out_of_the_distribution_and_get_no_gradient():
    head, hidden, targets = case(bias=False)
    targets[targets == 5] = 6  # the engine never samples a suppressed token
    weights = torch.randn(2, ROWS)
    chunked = token_logprobs(hidden, head, targets, suppressed=(5,), chunk_tokens=8)
    plain = plain_head(hidden, head, targets, suppressed=(5,))
    for mine, theirs in zip(chunked, plain, strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)
    mine, theirs = gradients(chunked, head, hidden, weights), gradients(plain, head, hidden, weights)
    torch.testing.assert_close(mine[1], theirs[1], atol=1e-5, rtol=1e-5)
    assert torch.equal(mine[1][5], torch.zeros(WIDTH))


def test_an_entropy_nothing_reads_costs_no_gradient_and_log_probs_alone_match():
    """An entropy coefficient of 0 leaves the entropy out of the loss: its gradient is not computed, and the
    log-probs' gradients are those of the log-probs alone."""
    head, hidden, targets = case(bias=False)
    logprobs, entropy = token_logprobs(hidden, head, targets, chunk_tokens=8)
    logprobs.sum().backward()
    reference_hidden = hidden.grad.clone()
    hidden.grad = None
    plain_head(hidden, head, targets)[0].sum().backward()
    torch.testing.assert_close(reference_hidden, hidden.grad, atol=1e-5, rtol=1e-5)
    assert entropy.grad_fn is not None  # still a tensor of the graph: a loss may read it


def test_bf16_compute_matches_the_plain_head_to_bf16s_rounding():
    head, hidden, targets = case(bias=False)
    chunked = token_logprobs(hidden, head, targets, compute_dtype=torch.bfloat16, chunk_tokens=8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = plain_head(hidden, head, targets)
    for mine, theirs in zip(chunked, plain, strict=True):
        assert mine.dtype == torch.float32
        torch.testing.assert_close(mine, theirs.float(), atol=2e-2, rtol=2e-2)


def test_no_head_token_still_runs_a_backward():
    head, hidden, targets = case(bias=False)
    logprobs, entropy = token_logprobs(hidden[:0], head, targets[:0])
    assert logprobs.shape == entropy.shape == (0,)
    (logprobs.sum() + entropy.sum()).backward()
    assert hidden.grad is not None and torch.equal(hidden.grad, torch.zeros_like(hidden))


def test_no_row_still_gives_the_head_weight_a_zero_gradient():
    """A micro-batch with no head token (a data-parallel filler, a rank whose rows are all filtered out) gives the
    head's weight a zero gradient, not none: under FSDP2 every rank must reduce the same tensors."""
    head, hidden, targets = case(bias=True)
    logprobs, entropy = token_logprobs(hidden[:0], head, targets[:0])
    (logprobs.sum() + entropy.sum()).backward()
    assert torch.equal(head.weight.grad, torch.zeros_like(head.weight))
    assert torch.equal(head.bias.grad, torch.zeros_like(head.bias))


@pytest.mark.parametrize("compute_dtype", [torch.float32, torch.bfloat16])
def test_interleaved_calls_on_one_weight_share_the_cpus_buffers_and_keep_their_own_results(compute_dtype):
    """Two calls' forwards, then their backwards in the other order (the buffers kept per weight on the CPU hold
    nothing a backward pass reads): each call's log-probs and gradients are what it computes alone."""
    from reasonrl.models import logprob_head

    head, first_hidden, first_targets = case(bias=False)
    _, second_hidden, second_targets = case(bias=False, seed=1)
    weights = torch.randn(2, ROWS, generator=torch.Generator().manual_seed(2))

    def alone(hidden, targets):
        outputs = token_logprobs(hidden, head, targets, compute_dtype=compute_dtype, chunk_tokens=8)
        return [o.detach() for o in outputs], gradients(outputs, head, hidden, weights)

    expected = [alone(first_hidden, first_targets), alone(second_hidden, second_targets)]
    first = token_logprobs(first_hidden, head, first_targets, compute_dtype=compute_dtype, chunk_tokens=8)
    buffers = logprob_head._CPU_SCRATCH.by_weight[head.weight].logits.data_ptr()
    second = token_logprobs(second_hidden, head, second_targets, compute_dtype=compute_dtype, chunk_tokens=8)
    assert logprob_head._CPU_SCRATCH.by_weight[head.weight].logits.data_ptr() == buffers  # one set, reused
    second_grads = gradients(second, head, second_hidden, weights)  # the later call's backward first
    first_grads = gradients(first, head, first_hidden, weights)
    got = [([o.detach() for o in first], first_grads), ([o.detach() for o in second], second_grads)]
    for (values, grads), (expected_values, expected_grads) in zip(got, expected, strict=True):
        for mine, theirs in zip([*values, *grads], [*expected_values, *expected_grads], strict=True):
            torch.testing.assert_close(mine, theirs, atol=0, rtol=0)
