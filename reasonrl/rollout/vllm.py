"""The vLLM engine (GPU machines; ``pip install 'reasonrl[gpu]'``), behind the same protocol.

vLLM runs in this process (``distributed_executor_backend="external_launcher"``, as TRL's colocate
mode does), so trainer weights are pushed into the served model in place with the model's own
``load_weights``, without a reload.  vLLM is imported only when this engine is built.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from reasonrl.rollout.base import Completion, SamplingParams, first_token_fire


def _single_process_defaults() -> None:
    """vLLM's external launcher expects torch.distributed variables; provide a one-process world."""
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", "29517")


class VLLMEngine:
    """Generation with vLLM on a CUDA device."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        dtype: torch.dtype | None = None,
        max_model_len: int = 4096,
        gpu_memory_utilization: float = 0.5,
        max_batch_sequences: int = 256,
    ) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("the vllm engine needs a CUDA device; use rollout.engine=fast or hf on a CPU")
        from vllm import LLM

        _single_process_defaults()
        self.llm = LLM(
            model=model.name_or_path,
            dtype=str(dtype or torch.bfloat16).removeprefix("torch."),
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            max_num_seqs=max_batch_sequences,
            distributed_executor_backend="external_launcher",
            logprobs_mode="processed_logprobs",  # log-probs of the distribution actually sampled
            enable_prefix_caching=True,  # the G samples of a prompt share its prefill
        )
        stop = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        eos = model.generation_config.eos_token_id
        stop |= set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.stop_token_ids = frozenset(stop)
        self.load_weights(model.state_dict())  # serve exactly the trainer's weights

    def _served_model(self) -> torch.nn.Module:
        return self.llm.llm_engine.model_executor.driver_worker.model_runner.model

    @torch.no_grad()
    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Push trainer weights into the served model in place, then drop stale cached prefixes."""
        served = self._served_model()
        for name, tensor in state_dict.items():
            served.load_weights([(name, tensor)])
        self.llm.reset_prefix_cache()

    def _vllm_params(self, params: SamplingParams, seed: int | None):
        from vllm import SamplingParams as VLLMSamplingParams

        return VLLMSamplingParams(
            n=1,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k or -1,
            max_tokens=params.max_new_tokens,
            seed=seed,
            logprobs=0,  # the sampled token's log-prob
            stop_token_ids=[] if params.ignore_stop else sorted(self.stop_token_ids),
            ignore_eos=params.ignore_stop,
        )

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        """One completion per prompt (request seeds derived from ``params.seed`` and the prompt index)."""
        if params.fire is not None:
            return first_token_fire(self.generate, prompts, params)
        requests = [{"prompt_token_ids": list(p)} for p in prompts]
        seeds = [None if params.seed is None else params.seed * 100_003 + i for i in range(len(prompts))]
        outputs = self.llm.generate(requests, [self._vllm_params(params, s) for s in seeds], use_tqdm=False)
        completions = []
        for output in outputs:
            sample = output.outputs[0]
            logprobs = [step[token].logprob for step, token in zip(sample.logprobs, sample.token_ids, strict=True)]
            reason = "stop" if sample.finish_reason == "stop" else "length"
            completions.append(Completion(list(sample.token_ids), logprobs, reason))
        return completions
