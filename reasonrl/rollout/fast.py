"""The ``fast`` engine: our own decode loop for Llama-family models, with continuous batching.

What makes it fast on a CPU where transformers' ``generate`` reaches a few percent of the matmul
peak: weights held once in bf16 with fused projections (q|k|v and gate|up), a KV cache allocated
once per call, one Python-level model step per token for the whole batch, inverse-CDF sampling
(one uniform per row instead of exponential noise over 49k logits), and continuous batching — a
finished sequence's slot takes the next prompt at once, so the batch stays full while prompts
remain.  Weight updates from the trainer are copied into the fused tensors in place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from reasonrl.models.load import ModelError
from reasonrl.rollout.engine_protocol import Completion, RolloutEngine, SamplingParams, request_seed, stop_token_ids_of
from reasonrl.rollout.sampling import sample_tokens

SUPPORTED = ("llama", "mistral", "qwen2")
CACHE_BLOCK = 32  # the KV cache grows by this many positions at a time


class UnsupportedModel(ModelError):
    """The fast engine cannot run this architecture (use rollout.engine=hf)."""


class _Linear:
    """A bias-free-or-not linear layer in the serving dtype.  On CPUs with oneDNN the weight is
    pre-packed once per weight update (about 20% faster matmuls for decode-sized inputs, 2× for
    small ones, than repacking on every call as ``F.linear`` does)."""

    def __init__(self, weight: Tensor, bias: Tensor | None, pack: bool) -> None:
        self.pack = pack
        self.bias = bias
        self.set(weight)

    def set(self, weight: Tensor) -> None:
        """Replace the weight [out, in] (already in the serving dtype)."""
        self.out_features = weight.shape[0]
        if self.pack:
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), 64)
        else:
            self.weight = weight.contiguous()

    def __call__(self, x: Tensor) -> Tensor:
        if self.pack:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


def _can_pack(dtype: torch.dtype) -> bool:
    """Whether oneDNN weight pre-packing works here (CPU builds with mkldnn, bf16/fp32)."""
    try:
        weight = torch.zeros(8, 8, dtype=dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 4)
        torch.ops.mkldnn._linear_pointwise(torch.ones(2, 8, dtype=dtype), packed, None, "none", [], "")
        return True
    except (RuntimeError, AttributeError):
        return False


class _Weights:
    """A Llama-family decoder's weights in the serving dtype: q|k|v and gate|up fused, each fused
    linear remembering the HF parameter names it is built from (for weight updates)."""

    def __init__(self, model: PreTrainedModel, dtype: torch.dtype) -> None:
        cfg = model.config
        other = "; rollout.engine=hf runs any causal LM (vllm: the architectures vLLM supports)"
        if cfg.model_type not in SUPPORTED:
            raise UnsupportedModel(f"the fast engine runs {', '.join(SUPPORTED)} models, not {cfg.model_type!r}{other}")
        rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise UnsupportedModel(f"the fast engine supports default RoPE only, not {rope}{other}")
        if getattr(cfg, "hidden_act", "silu") != "silu":
            raise UnsupportedModel(f"the fast engine supports SiLU MLPs only, not {cfg.hidden_act}{other}")
        self.dtype = dtype
        self.pack = _can_pack(dtype)
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.eps = cfg.rms_norm_eps
        self.rope_theta = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        state = model.state_dict()
        self.linears: list[tuple[_Linear, list[str]]] = []  # fused linear, its HF weight names
        self.plain: dict[str, Tensor] = {}  # HF name -> norm / embedding tensor, updated with copy_

        self.biases: list[tuple[Tensor, list[str]]] = []  # fused bias (q|k|v in Qwen2), its HF names

        def linear(names: list[str], bias_names: list[str] | None = None) -> _Linear:
            bias = None
            if bias_names and all(n in state for n in bias_names):
                bias = self._fused([state[n].detach() for n in bias_names], bias_names)
                self.biases.append((bias, bias_names))
            fused = _Linear(self._fused([state[n].detach() for n in names], names), bias, self.pack)
            self.linears.append((fused, names))
            return fused

        def plain(name: str) -> Tensor:
            self.plain[name] = state[name].detach().to(dtype).clone()
            return self.plain[name]

        self.embed = plain("model.embed_tokens.weight")
        self.layers = []
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            attn = [f"{p}self_attn.{x}_proj" for x in "qkv"]
            self.layers.append(
                {
                    "ln1": plain(f"{p}input_layernorm.weight"),
                    "qkv": linear([f"{n}.weight" for n in attn], [f"{n}.bias" for n in attn]),
                    "o": linear([f"{p}self_attn.o_proj.weight"]),
                    "ln2": plain(f"{p}post_attention_layernorm.weight"),
                    "gate_up": linear([f"{p}mlp.gate_proj.weight", f"{p}mlp.up_proj.weight"]),
                    "down": linear([f"{p}mlp.down_proj.weight"]),
                }
            )
        self.norm = plain("model.norm.weight")
        tied = cfg.tie_word_embeddings or "lm_head.weight" not in state
        self.lm_head = linear(["model.embed_tokens.weight" if tied else "lm_head.weight"])

    def _fused(self, parts: list[Tensor], names: list[str]) -> Tensor:
        """Concatenate parameters along their output rows, in the serving dtype.  The query projection
        is pre-scaled by 1/sqrt(head_dim) (RoPE is linear, so the attention scores come out scaled)."""
        scaled = [p * self.head_dim**-0.5 if ".q_proj." in n else p for p, n in zip(parts, names, strict=True)]
        return torch.cat(scaled).to(self.dtype)

    @torch.no_grad()
    def load(self, state_dict: Mapping[str, Tensor]) -> None:
        """Take new trainer weights: copy norms/embeddings in place, rebuild (and re-pack) the fused linears."""
        for name, tensor in self.plain.items():
            if name in state_dict:
                tensor.copy_(state_dict[name])
        for fused, names in self.linears:
            if all(n in state_dict for n in names):
                fused.set(self._fused([state_dict[n] for n in names], names))
        for bias, names in self.biases:
            if all(n in state_dict for n in names):
                bias.copy_(self._fused([state_dict[n] for n in names], names))


def request_uniforms(params: SamplingParams, count: int) -> Tensor:
    """The uniforms each of ``count`` prompts draws its tokens with: row i from a generator seeded with
    ``request_seed(params, i)`` (fresh entropy when unseeded), one per response position, so a
    completion depends on its own seed only, never on which prompts share the batch.  -> [count, max_new_tokens]"""
    rows = []
    for i in range(count):
        generator = torch.Generator()
        seed = request_seed(params, i)
        generator.manual_seed(seed) if seed is not None else generator.seed()
        rows.append(torch.rand(params.max_new_tokens, generator=generator))
    return torch.stack(rows)


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class FastEngine(RolloutEngine):
    """Continuous-batching decoder behind the RolloutEngine protocol."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        dtype: torch.dtype | None = None,
        max_batch_sequences: int = 64,
        prefill_tokens: int = 4096,
    ) -> None:
        self.dtype = dtype or torch.bfloat16
        self.w = _Weights(model, self.dtype)
        self.max_batch_sequences = max_batch_sequences
        self.prefill_tokens = prefill_tokens
        self.stop_token_ids = stop_token_ids_of(model, tokenizer)
        self._stop = torch.tensor(sorted(self.stop_token_ids), dtype=torch.long)
        inv_freq = 1.0 / (self.w.rope_theta ** (torch.arange(0, self.w.head_dim, 2).float() / self.w.head_dim))
        self._inv_freq = inv_freq
        self._cos = self._sin = torch.empty(0)

    def load_weights(self, state_dict: Mapping[str, Tensor]) -> None:
        """Trainer weights land in place; no reload, no reallocation."""
        self.w.load(state_dict)

    # --- the model ---------------------------------------------------------------------------------

    def _rope_tables(self, length: int) -> None:
        if self._cos.shape[0] >= length:
            return
        positions = torch.arange(max(length, 2 * self._cos.shape[0]), dtype=torch.float32)
        freqs = torch.outer(positions, self._inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)  # [L, head_dim]
        self._cos, self._sin = emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    def _norm(self, x: Tensor, weight: Tensor) -> Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, eps=self.w.eps)  # accumulates in fp32 for bf16 inputs

    def _rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin [..., 1, head_dim] for positions [...] (computed once per forward, used by every layer)."""
        return self._cos[positions].unsqueeze(-2), self._sin[positions].unsqueeze(-2)

    def _qkv(self, layer: dict, h: Tensor, rope: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """Projections with RoPE applied; h [..., d] -> q [..., H, hd] (pre-scaled), k, v [..., Hkv, hd]."""
        w = self.w
        qkv = layer["qkv"](h)
        rotary = qkv[..., : (w.heads + w.kv_heads) * w.head_dim].unflatten(-1, (w.heads + w.kv_heads, w.head_dim))
        cos, sin = rope
        rotary = rotary * cos + _rotate_half(rotary) * sin
        q, k = rotary[..., : w.heads, :], rotary[..., w.heads :, :]
        v = qkv[..., (w.heads + w.kv_heads) * w.head_dim :].unflatten(-1, (w.kv_heads, w.head_dim))
        return q, k, v

    def _mlp(self, layer: dict, x: Tensor) -> Tensor:
        gate, up = layer["gate_up"](self._norm(x, layer["ln2"])).chunk(2, dim=-1)
        return x + layer["down"](F.silu(gate) * up)

    def _logits(self, x: Tensor) -> Tensor:
        return self.w.lm_head(self._norm(x, self.w.norm)).float()

    def _prefill(
        self, tokens: Tensor, lengths: Tensor, cache: list[tuple[Tensor, Tensor]], slots: Tensor, owner: Tensor
    ) -> Tensor:
        """Run distinct right-padded prompts [u, P]; slot ``slots[i]`` gets the K/V of prompt ``owner[i]``
        (a prompt sampled G times is processed once); returns the logits at each prompt's last token [u, V]."""
        w = self.w
        b, length = tokens.shape
        rope = self._rope(torch.arange(length).expand(b, length))
        x = w.embed[tokens]  # [b, P, d]
        for layer, (keys, values) in zip(w.layers, cache, strict=True):
            q, k, v = self._qkv(layer, self._norm(x, layer["ln1"]), rope)  # [b, P, *, hd]
            keys[slots, :, :, :length] = k.permute(0, 2, 3, 1)[owner]  # keys are stored transposed: [S, Hkv, hd, L]
            values[slots, :, :length] = v.transpose(1, 2)[owner]
            # right padding + causal attention: real tokens never see the padding after them
            attn = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True, scale=1.0
            )
            x = x + layer["o"](attn.transpose(1, 2).flatten(2))
            x = self._mlp(layer, x)
        last = x[torch.arange(b), lengths - 1]  # [b, d]
        return self._logits(last)

    def _decode(self, tokens: Tensor, positions: Tensor, cache: list[tuple[Tensor, Tensor]]) -> Tensor:
        """One token for every slot: tokens, positions [S] -> logits [S, V].

        Attention reads the whole cache (future positions masked).  The cache grows in blocks of
        ``CACHE_BLOCK`` positions as sequences lengthen (``_grow``), so it never holds much beyond
        the longest live sequence, and its matrices are contiguous: bf16 ``matmul`` on a sliced cache
        would copy it in every layer of every step.
        """
        w = self.w
        slots, span = tokens.shape[0], cache[0][1].shape[2]
        group = w.heads // w.kv_heads
        rows = torch.arange(slots)
        future = torch.arange(span)[None, :] > positions[:, None]  # [S, span]
        bias = torch.zeros(slots, 1, 1, span, dtype=self.dtype).masked_fill(future[:, None, None, :], float("-inf"))
        rope = self._rope(positions)
        x = w.embed[tokens]  # [S, d]
        for layer, (keys, values) in zip(w.layers, cache, strict=True):
            q, k, v = self._qkv(layer, self._norm(x, layer["ln1"]), rope)  # q [S, H, hd]
            keys[rows, :, :, positions] = k
            values[rows, :, positions] = v
            q = q.reshape(slots * w.kv_heads, group, w.head_dim)
            scores = torch.bmm(q, keys.view(-1, w.head_dim, span)).view(slots, w.kv_heads, group, span) + bias
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(self.dtype)  # scores came pre-scaled
            attn = torch.bmm(probs.view(-1, group, span), values.view(-1, span, w.head_dim))  # [S·Hkv, G, hd]
            x = x + layer["o"](attn.view(slots, -1))
            x = self._mlp(layer, x)
        return self._logits(x)

    # --- the scheduler -------------------------------------------------------------------------------

    def _grow(self, cache: list[tuple[Tensor, Tensor]], needed: int, cap: int, slots: int = 0) -> list:
        """The KV cache with room for ``needed`` positions (rounded up to a block, at most ``cap``);
        keys are stored transposed ([S, Hkv, hd, L]), values as [S, Hkv, L, hd]."""
        have = cache[0][1].shape[2] if cache else 0
        if needed <= have:
            return cache
        w = self.w
        size = min(cap, -(-needed // CACHE_BLOCK) * CACHE_BLOCK)
        slots = cache[0][1].shape[0] if cache else slots
        grown = []
        for layer in range(len(w.layers)):
            keys = torch.zeros(slots, w.kv_heads, w.head_dim, size, dtype=self.dtype)
            values = torch.zeros(slots, w.kv_heads, size, w.head_dim, dtype=self.dtype)
            if cache:
                keys[..., :have] = cache[layer][0]
                values[:, :, :have] = cache[layer][1]
            grown.append((keys, values))
        return grown

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        """Completions in prompt order; at most ``max_batch_sequences`` are decoded together."""
        if not prompts:
            return []
        uniforms = request_uniforms(params, len(prompts))  # [N, max_new_tokens]
        slots = min(self.max_batch_sequences, len(prompts))
        span_cap = max(len(p) for p in prompts) + params.max_new_tokens
        self._rope_tables(span_cap)
        cache = self._grow([], max(len(p) for p in prompts), span_cap, slots)
        request = torch.full((slots,), -1, dtype=torch.long)  # which prompt a slot serves; -1 = free
        position = torch.zeros(slots, dtype=torch.long)  # where the slot's next token goes
        produced = torch.zeros(slots, dtype=torch.long)  # tokens generated so far
        next_token = torch.zeros(slots, dtype=torch.long)
        out_tokens = torch.zeros(len(prompts), params.max_new_tokens, dtype=torch.long)
        out_logprobs = torch.zeros(len(prompts), params.max_new_tokens)
        finished_len = torch.zeros(len(prompts), dtype=torch.long)
        stopped = torch.zeros(len(prompts), dtype=torch.bool)
        fire_positions = torch.tensor(params.fire.positions if params.fire else [], dtype=torch.long)
        queue = list(range(len(prompts)))[::-1]

        def record(slot_ids: Tensor, tokens: Tensor, logprobs: Tensor) -> None:
            """Store sampled tokens; finish slots that stopped or reached the cap."""
            req = request[slot_ids]
            out_tokens[req, produced[slot_ids]] = tokens
            out_logprobs[req, produced[slot_ids]] = logprobs
            produced[slot_ids] += 1
            is_stop = torch.isin(tokens, self._stop) & (not params.ignore_stop)
            done = is_stop | (produced[slot_ids] >= params.max_new_tokens)
            if bool(done.any()):
                done_slots = slot_ids[done]
                finished_len[request[done_slots]] = produced[done_slots]
                stopped[request[done_slots]] = is_stop[done]
                request[done_slots] = -1

        def sample(logits: Tensor, slot_ids: Tensor) -> tuple[Tensor, Tensor]:
            fire_rows = torch.isin(produced[slot_ids], fire_positions) if params.fire else None
            return sample_tokens(
                logits,
                params.temperature,
                params.top_k,
                params.top_p,
                uniforms[request[slot_ids], produced[slot_ids]],
                fire_rows,
                params.fire,
            )

        while queue or bool((request >= 0).any()):
            free = (request < 0).nonzero().squeeze(-1)
            if queue and free.numel():
                self._admit(free, queue, prompts, request, position, produced, next_token, cache, record, sample)
            active = (request >= 0).nonzero().squeeze(-1)
            if not active.numel():
                continue
            if active.numel() <= slots // 2 and not queue and slots > 8:  # compact: stop computing idle slots
                cache = [(k[active], v[active]) for k, v in cache]
                request, position, produced, next_token = (t[active] for t in (request, position, produced, next_token))
                slots = active.numel()
                active = torch.arange(slots)
            cache = self._grow(cache, int(position[active].max()) + 1, span_cap)
            position[request < 0] = 0  # an idle slot's write lands in its own unused row, never past the cache
            logits = self._decode(next_token, position, cache)
            tokens, logprobs = sample(logits[active], active)
            record(active, tokens, logprobs)
            next_token[active] = tokens
            position[active] += 1
        completions = []
        for i in range(len(prompts)):
            n = int(finished_len[i])
            completions.append(
                Completion(
                    out_tokens[i, :n].tolist(), out_logprobs[i, :n].tolist(), "stop" if bool(stopped[i]) else "length"
                )
            )
        return completions

    def _admit(self, free, queue, prompts, request, position, produced, next_token, cache, record, sample) -> None:
        """Prefill as many queued prompts as there are free slots (in token-budgeted chunks)."""
        free = free.tolist()
        while free and queue:
            chosen, width = [], 0
            while len(chosen) < len(free) and queue:
                candidate = len(prompts[queue[-1]])
                if chosen and max(width, candidate) * (len(chosen) + 1) > self.prefill_tokens:
                    break
                chosen.append(queue.pop())
                width = max(width, candidate)
            slot_ids = torch.tensor(free[: len(chosen)], dtype=torch.long)
            free = free[len(chosen) :]
            distinct: dict[tuple[int, ...], int] = {}
            owner = torch.tensor([distinct.setdefault(tuple(prompts[r]), len(distinct)) for r in chosen])
            lengths = torch.tensor([len(p) for p in distinct], dtype=torch.long)
            batch = torch.zeros(len(distinct), width, dtype=torch.long)
            for row, prompt in enumerate(distinct):
                batch[row, : len(prompt)] = torch.tensor(prompt, dtype=torch.long)
            logits = self._prefill(batch, lengths, cache, slot_ids, owner)[owner]
            request[slot_ids] = torch.tensor(chosen, dtype=torch.long)
            produced[slot_ids] = 0
            position[slot_ids] = lengths[owner]
            tokens, logprobs = sample(logits, slot_ids)
            record(slot_ids, tokens, logprobs)
            next_token[slot_ids] = tokens
