"""A bf16 input embedding's gradient summed in fp32 (models/embedding_gradient.py)."""

import torch
import torch.nn.functional as F

from reasonrl.models.embedding_gradient import EmbeddingWithFp32GradientSum, sum_embedding_gradients_in_fp32
from reasonrl.models.load import load_model


def test_a_frequent_tokens_gradient_is_its_fp32_sum_where_torchs_bf16_lookup_stalls():
    ids = torch.tensor([0] * 2000 + [3, 3, 1])
    grad = torch.full((len(ids), 8), 0.01, dtype=torch.bfloat16)
    weight = torch.nn.Parameter(torch.randn(5, 8, dtype=torch.bfloat16))
    F.embedding(ids, weight).backward(grad)
    assert weight.grad[0, 0].item() < 5  # torch's CPU kernel: additions below half a bf16 bit are lost
    weight.grad = None
    out = EmbeddingWithFp32GradientSum.apply(ids, weight, None)
    assert torch.equal(out, F.embedding(ids, weight))
    out.backward(grad)
    expected = torch.zeros(5, 8).index_add_(0, ids, grad.float()).to(torch.bfloat16)
    assert torch.equal(weight.grad, expected) and weight.grad[0, 0].item() == 20.0


def test_the_padding_row_gets_no_gradient():
    ids = torch.tensor([[0, 2, 2], [1, 2, 0]])
    weight = torch.nn.Parameter(torch.randn(4, 3, dtype=torch.bfloat16))
    EmbeddingWithFp32GradientSum.apply(ids, weight, 2).sum().backward()
    assert torch.equal(weight.grad[2], torch.zeros(3, dtype=torch.bfloat16))
    assert torch.equal(weight.grad[0], torch.full((3,), 2.0, dtype=torch.bfloat16))


def test_a_bf16_model_sums_its_embedding_gradient_in_fp32_and_computes_the_same_outputs():
    ids = torch.randint(3, 13, (4, 300))  # 1,200 tokens over 10 ids (not the padding id, 2): about 120 each
    plain, hooked = (load_model("tiny-random", torch.bfloat16) for _ in range(2))
    assert sum_embedding_gradients_in_fp32(hooked)
    outputs = []
    for model in (plain, hooked):
        hidden = model.model(input_ids=ids).last_hidden_state
        outputs.append(hidden.detach())
        grad = torch.autograd.grad(hidden.float().square().mean(), model.model.embed_tokens.weight)[0]
        outputs.append(grad)
    assert torch.equal(outputs[0], outputs[2])  # the same forward
    # the reference: the lookup's gradient [tokens, d] summed per id in fp32
    inputs = hooked.model.embed_tokens(ids).detach().requires_grad_()
    hidden = hooked.model(inputs_embeds=inputs).last_hidden_state
    per_token = torch.autograd.grad(hidden.float().square().mean(), inputs)[0]
    expected = torch.zeros(hooked.model.embed_tokens.weight.shape).index_add_(
        0, ids.flatten(), per_token.flatten(0, 1).float()
    )
    assert torch.equal(outputs[3], expected.to(torch.bfloat16))
    assert not torch.equal(outputs[1], outputs[3])  # torch's bf16 sums differ


def test_an_fp32_embedding_keeps_torchs_lookup():
    model = load_model("tiny-random", torch.float32)
    assert sum_embedding_gradients_in_fp32(model)  # the hook stands by: FSDP2 may all-gather the weight in bf16
    ids = torch.randint(0, 10, (2, 5))
    out = model.model.embed_tokens(ids)
    assert out.grad_fn.name() == "EmbeddingBackward0"
