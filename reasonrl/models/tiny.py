"""``tiny-random``: a small randomly initialised Llama and a byte-level tokenizer, built locally.

For tests: it needs no network and no download, builds in about a second, and uses the same
ChatML chat template as SmolLM2, so prompts look alike.
"""

from __future__ import annotations

from pathlib import Path

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def tiny_tokenizer(extra_special_tokens: tuple[str, ...] = ()):
    """A byte-level BPE tokenizer without merges: ChatML specials, then ``extra_special_tokens``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = [*SPECIAL_TOKENS, *extra_special_tokens]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {token: i for i, token in enumerate(specials + sorted(alphabet))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(specials)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def tiny_llama_config(tokenizer, head_dim: int | None = None):
    """The tiny Llama: 2 layers, d = 64, 4 heads (2 KV heads), tied embeddings."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def build_tiny_random(directory: Path, seed: int = 0, head_dim: int | None = None) -> None:
    """Write a tiny Llama (2 layers, d=64) with a byte-level tokenizer to ``directory``.

    ``head_dim`` overrides the attention head size (16 by default); vLLM's CPU attention needs 32 or more.
    """
    import torch
    from transformers import LlamaForCausalLM

    tokenizer = tiny_tokenizer()
    config = tiny_llama_config(tokenizer, head_dim)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


# ChatML whose messages may be lists of parts ({"type": "image"} or {"type": "text", "text": ...}), the
# format a processor's chat template takes; an image part becomes the processor's <image> placeholder
CHATML_VISION_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<image>' }}{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# what Idefics3's processor writes (it adds any that the tokenizer lacks, past the model's embeddings)
VISION_TOKENS = ("<image>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>")
TINY_IMAGE_SIZE, TINY_PATCH = 96, 16


def build_tiny_random_vlm(directory: Path, seed: int = 0, head_dim: int | None = None) -> None:
    """Write a tiny Idefics3 vision-language model (SmolVLM's architecture: a SigLIP-style encoder of 2
    layers, d = 32, on 96-pixel images in 16-pixel patches; a pixel-shuffle connector; the tiny Llama) and
    its processor to ``directory``: each image becomes (96 / 16)² / 2² = 9 image tokens.  ``head_dim`` as
    for ``build_tiny_random``."""
    import torch
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    tokenizer = tiny_tokenizer(VISION_TOKENS)
    tokenizer.chat_template = CHATML_VISION_TEMPLATE
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
              "image_size": TINY_IMAGE_SIZE, "patch_size": TINY_PATCH}  # fmt: skip
    config = Idefics3Config(
        text_config=tiny_llama_config(tokenizer, head_dim).to_dict(),
        vision_config=vision,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        scale_factor=2,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Idefics3ForConditionalGeneration(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    edge = {"longest_edge": TINY_IMAGE_SIZE}
    images = Idefics3ImageProcessorPil(do_image_splitting=False, size=edge, max_image_size=edge)
    processor = Idefics3Processor(
        images, tokenizer, image_seq_len=(TINY_IMAGE_SIZE // TINY_PATCH) ** 2 // 4, chat_template=CHATML_VISION_TEMPLATE
    )
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
