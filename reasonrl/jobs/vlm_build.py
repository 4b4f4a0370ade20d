"""``reasonrl vlm build``: a small vision-language model made here, the way Seed1.5-VL is made, in miniature.

No small VLM ships its weights in a package this project can install offline, so reasonrl builds one
(arXiv 2505.07062, §3–4, scaled to two CPU cores) on the embedded language model:

1. **Assemble** an Idefics3 model (SmolVLM's architecture, which transformers and vLLM load): a
   SigLIP-style vision encoder (random), the pixel-shuffle connector (random), and the language model's
   weights; the tokenizer gains Idefics3's image tokens and a chat template that places images.
2. **Encoder pretraining** on rendered images of the visual tasks: masked image modelling (half of each
   image's patches hidden, the pixels of every patch predicted by a linear probe, dropped afterwards), the
   label-free objective of Seed1.5-VL's first ViT stage (which distils a teacher's features instead of
   pixels).
3. **Image-text contrastive learning** of the encoder on the images' captions (CLIP's loss against a small
   text tower over the language model's frozen token embeddings, dropped afterwards): Seed1.5-VL's second
   ViT stage.
4. **Alignment**, the language model frozen (Seed1.5-VL's projector warm-up): each image token (one per
   16-pixel patch) learns to be read as the word its cell holds — the character written there, the colour
   of the shape centred there, or a space — scored against the language model's own token embeddings. The
   connector starts at the scale of those embeddings.
5. **Supervised fine-tuning** of the whole model on the tasks' visual questions (train splits), answers
   in the "Answer: ..." form the verifiers read.

Differences from the paper: a 1.9M-parameter ViT at 96 pixels, not a 532M native-resolution one; MIM on
pixels, not distillation, and on every patch: these images are white with a few small shapes, and a loss
on the hidden patches alone left the features of the visible ones uninformative (docs/benchmarks.md,
"Vision-language RL"); alignment on each patch's word, not on captions, and with the encoder trained too:
a caption read through the frozen language model carried 0.08 nats of the image per token after 200 steps
and SFT then lost it, where the per-patch target makes the image tokens text the language model already
reads; one image token per patch (no pixel shuffle: 36 tokens); captions and questions generated, not web
data; a few hundred steps per stage; no video, no 2D RoPE, no MoE.  Without ``--out`` the result goes to the
reasonrl cache, where ``model.name_or_path=smollm2-135m-vlm`` finds the default recipe's build (loading a model
never builds one).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from reasonrl.algo.contrastive_losses import image_text_contrastive
from reasonrl.data.examples import Example
from reasonrl.data.loaders import load_examples
from reasonrl.data.prompts import TEMPLATES
from reasonrl.data.visual_tasks import CELL
from reasonrl.models.forward import autocast_context
from reasonrl.models.load import COMPLETE_MARKER, cache_root, compute_dtype, load_model, load_tokenizer
from reasonrl.models.tiny import CHATML_VISION_TEMPLATE, VISION_TOKENS
from reasonrl.timing import Progress

IMAGE_SIZE, PATCH_SIZE, SCALE_FACTOR = 96, CELL, 1  # one image token per patch: per cell of ``fields["cells"]``
IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2 // SCALE_FACTOR**2  # 36 per image
MASKED_FRACTION = 0.5
CAPTION_REQUEST = "Describe the image."
CONTRASTIVE_DIM = 128  # the shared image-text space of stage 3
INITIAL_TEMPERATURE = 0.07  # CLIP's


@dataclass(frozen=True)
class VLMBuildRun:
    """What ``reasonrl vlm build`` runs: a small vision-language model assembled in Seed1.5-VL's stages
    (arXiv 2505.07062, §3–4) in miniature — a vision encoder pretrained on rendered images (masked image
    modelling, then image-text contrastive learning), a connector aligned with the language model frozen,
    then supervised fine-tuning on visual questions."""

    language_model: str = "smollm2-135m"
    """The language model the VLM is built on (a spec as model.name_or_path)."""

    out: str | None = None
    """Where the VLM goes (a Hugging Face directory with its processor); None = the reasonrl cache, where
    ``model.name_or_path=smollm2-135m-vlm`` finds it."""

    tasks: str = "visual_arithmetic"
    """The visual tasks (comma-separated) whose train splits supply the images, captions and questions of
    every stage; the default teaches reading the sums (counting, grounding and pointing build too, but no
    recipe has yet made them better than chance: docs/benchmarks.md, "Vision-language RL")."""

    vision_hidden: int = 192
    """Width of the vision encoder (Idefics3's SigLIP-style ViT; 96-pixel images in 16-pixel patches)."""

    vision_layers: int = 4
    """Transformer layers of the vision encoder."""

    encoder_steps: int = 600
    """Stage 2, encoder pretraining: masked image modelling steps (half the patches hidden, every patch's
    pixels predicted), the label-free objective of Seed1.5-VL's first ViT stage."""

    contrastive_steps: int = 400
    """Stage 3, image-text contrastive learning of the encoder on the images' captions (CLIP's loss),
    Seed1.5-VL's second ViT stage."""

    align_steps: int = 200
    """Stage 4, alignment (the language model frozen): steps training the encoder and the connector so that
    each image token is read as the word of its 16-pixel cell (the character written there, the colour of
    the shape centred there, or a space), at ``lr`` with batches of 4 × ``batch_size`` images."""

    sft_steps: int = 120
    """Stage 5, supervised fine-tuning: steps training the whole model on the tasks' visual questions (on
    the default task, 100 steps give 13% of held-out sums, 120 about 38%, 150 70%: RL needs room above;
    ``bench/vlm_sft_steps.py``)."""

    batch_size: int = 8
    """Examples per step of stage 5 (stages 2–4 take 4×: they run no language model)."""

    lr: float = 1e-3
    """Learning rate of the stages that run no language model (2–4) and of the heads they train."""

    adapter_lr: float = 1e-4
    """Learning rate of the vision encoder and the connector in stage 5, where the language model reads
    them."""

    language_model_lr: float = 3e-5
    """Learning rate of the language model's weights in stage 5."""

    seed: int = 0
    """Seed of the initialisation and of the order of examples."""


def assemble(settings: VLMBuildRun):
    """(the Idefics3 model with the language model's weights and random vision parts, its processor)."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    language_model, tokenizer = load_model(settings.language_model), load_tokenizer(settings.language_model)
    tokenizer.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    tokenizer.chat_template = CHATML_VISION_TEMPLATE
    vision = {
        "hidden_size": settings.vision_hidden,
        "intermediate_size": 4 * settings.vision_hidden,
        "num_hidden_layers": settings.vision_layers,
        "num_attention_heads": max(1, settings.vision_hidden // 64),
        "image_size": IMAGE_SIZE,
        "patch_size": PATCH_SIZE,
    }
    text = language_model.config
    config = Idefics3Config(
        text_config=text.to_dict(),
        vision_config=vision,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        scale_factor=SCALE_FACTOR,
        tie_word_embeddings=text.tie_word_embeddings,
    )
    torch.manual_seed(settings.seed)
    model = Idefics3ForConditionalGeneration(config)
    model.model.text_model.load_state_dict(language_model.model.state_dict())
    model.lm_head.load_state_dict(language_model.lm_head.state_dict())
    model.resize_token_embeddings(len(tokenizer))  # the image tokens: new rows at the embeddings' mean
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    edge = {"longest_edge": IMAGE_SIZE}
    images = Idefics3ImageProcessorPil(do_image_splitting=False, size=edge, max_image_size=edge)
    processor = Idefics3Processor(images, tokenizer, image_seq_len=IMAGE_TOKENS, chat_template=CHATML_VISION_TEMPLATE)
    return model, processor


def batches(examples: Sequence[Example], size: int, seed: int) -> Iterator[list[Example]]:
    """Endless seeded shuffles of ``examples`` in batches of ``size``."""
    if len(examples) < size:
        raise ValueError(f"{len(examples)} examples cannot fill a batch of {size}")
    rng = random.Random(seed)
    while True:
        order = rng.sample(range(len(examples)), len(examples))
        for start in range(0, len(order) - size + 1, size):
            yield [examples[i] for i in order[start : start + size]]


def optimizer_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer, parameters: list) -> float:
    """Backpropagate ``loss``, clip the gradient norm of ``parameters`` at 1, step and clear; returns the loss."""
    loss.backward()
    torch.nn.utils.clip_grad_norm_(parameters, 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def pretrain_encoder(model, processor, examples, settings: VLMBuildRun, advance: Callable[[int], None]) -> list[float]:
    """Stage 2: masked image modelling on the encoder alone, every patch's pixels predicted from the image with
    half its patches hidden; returns the per-step losses."""
    encoder = model.model.vision_model
    patch_pixels = 3 * PATCH_SIZE * PATCH_SIZE
    probe = torch.nn.Linear(settings.vision_hidden, patch_pixels)  # pixels of a patch from its state
    parameters = [*encoder.parameters(), *probe.parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=settings.lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(settings.seed)
    losses = []
    encoder.train()
    for batch in itertools.islice(batches(examples, 4 * settings.batch_size, settings.seed), settings.encoder_steps):
        pixels = processor.image_processor([[e.images[0]] for e in batch], return_tensors="pt")["pixel_values"][:, 0]
        patches = pixels.unfold(2, PATCH_SIZE, PATCH_SIZE).unfold(3, PATCH_SIZE, PATCH_SIZE)  # [B, 3, h, w, p, p]
        patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(len(batch), -1, patch_pixels)  # [B, N, 3p²]
        hidden = torch.rand(patches.shape[:2], generator=generator) < MASKED_FRACTION  # [B, N]
        side = IMAGE_SIZE // PATCH_SIZE
        pixel_mask = hidden.view(-1, 1, side, 1, side, 1).expand(-1, 3, -1, PATCH_SIZE, -1, PATCH_SIZE)
        shown = pixels * ~pixel_mask.reshape(pixels.shape)  # hidden patches at 0 (mid-grey after normalising)
        states = encoder(pixel_values=shown).last_hidden_state  # [B, N, d]
        loss = torch.nn.functional.mse_loss(probe(states), patches)  # every patch: the visible ones too
        losses.append(optimizer_step(loss, optimizer, parameters))
        advance(1)
    encoder.eval()
    return losses


def contrast_images_and_captions(model, processor, examples, settings: VLMBuildRun, advance) -> list[float]:
    """Stage 3: CLIP's image-text loss between the encoder's mean-pooled patches and each image's caption,
    read by a text tower (one transformer layer over the language model's frozen token embeddings), both
    centred over the batch; returns the per-step losses."""
    encoder, embeddings = model.model.vision_model, model.model.text_model.get_input_embeddings()
    width = settings.vision_hidden
    image_head = torch.nn.Linear(width, CONTRASTIVE_DIM)
    text_in = torch.nn.Linear(embeddings.embedding_dim, width)
    text_layer = torch.nn.TransformerEncoderLayer(width, max(1, width // 64), 4 * width, dropout=0.0, batch_first=True)
    text_head = torch.nn.Linear(width, CONTRASTIVE_DIM)
    log_scale = torch.nn.Parameter(torch.tensor(-math.log(INITIAL_TEMPERATURE)))  # learnt, as CLIP's
    towers = [image_head, text_in, text_layer, text_head]
    parameters = [*encoder.parameters(), *(p for t in towers for p in t.parameters()), log_scale]
    optimizer = torch.optim.AdamW(parameters, lr=settings.lr, weight_decay=0.0)
    tokenizer, losses = processor.tokenizer, []
    encoder.train()
    shuffled = batches(examples, 4 * settings.batch_size, settings.seed + 2)
    for batch in itertools.islice(shuffled, settings.contrastive_steps):
        pixels = processor.image_processor([[e.images[0]] for e in batch], return_tensors="pt")["pixel_values"][:, 0]
        images = image_head(encoder(pixel_values=pixels).last_hidden_state.mean(1))  # [B, D]
        captions = tokenizer([e.fields["caption"] for e in batch], return_tensors="pt", padding=True)
        with torch.no_grad():
            tokens = embeddings(captions["input_ids"])  # [B, L, d_lm]
        states = text_layer(text_in(tokens), src_key_padding_mask=captions["attention_mask"] == 0)  # [B, L, w]
        kept = captions["attention_mask"].unsqueeze(-1).to(states.dtype)  # [B, L, 1]
        texts = text_head((states * kept).sum(1) / kept.sum(1))  # [B, D]
        # centred over the batch: the features of these images (and captions) share a large common part,
        # which left every cosine near 1 and the loss at ln B for hundreds of steps; the heads are dropped after
        loss, _ = image_text_contrastive(images - images.mean(0), texts - texts.mean(0), log_scale.exp())
        losses.append(optimizer_step(loss, optimizer, parameters))
        advance(1)
    encoder.eval()
    return losses


def match_connector_scale(model, processor, examples: Sequence[Example]) -> None:
    """Scale the connector so that its image tokens start at the mean norm of the language model's token
    embeddings: at a random init's scale they are several times larger, and the next stages then made them
    one large constant vector that carries no image (docs/benchmarks.md, "Vision-language RL")."""
    pixels = processor.image_processor([[e.images[0]] for e in examples], return_tensors="pt")["pixel_values"][:, 0]
    projection = model.model.connector.modality_projection.proj
    with torch.no_grad():
        image_tokens = model.model.connector(model.model.vision_model(pixel_values=pixels).last_hidden_state)
        text_norm = model.model.text_model.get_input_embeddings().weight.norm(dim=-1).mean()
        projection.weight.mul_(text_norm / image_tokens.norm(dim=-1).mean())


def conversation(example: Example, reply: str) -> tuple[list[dict], str]:
    """(the user turn with the image, the reply to learn): ``caption``, the image's caption (what
    ``bench/vlm_sft_probe.py`` measures image dependence on), or ``answer``, the answer in the form its
    verifier reads."""
    if reply == "caption":
        return _user(CAPTION_REQUEST), example.fields["caption"]
    question = example.question  # the math tasks ask as the prompt encoder does, for an "Answer:" line
    if example.task_type == "math":
        question = TEMPLATES["answer_line"].format(question=question)
    answer = example.answer
    if example.task_type == "grounding":
        answer = f"[{answer.replace(',', ', ')}]"
    elif example.task_type == "pointing":
        x1, y1, x2, y2 = map(int, answer.split(","))
        answer = f"({(x1 + x2) // 2}, {(y1 + y2) // 2})"
    return _user(question), f"Answer: {answer}"


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]


def supervised_batch(processor, batch: Sequence[Example], reply: str) -> dict[str, torch.Tensor]:
    """The model inputs of a batch of (image, question, reply) with ``labels`` on the reply only."""
    prompts, texts = [], []
    for example in batch:
        user, target = conversation(example, reply)
        prompts.append(processor.apply_chat_template(user, add_generation_prompt=True, tokenize=False))
        texts.append(prompts[-1] + target + processor.tokenizer.eos_token)
    images = [[e.images[0]] for e in batch]
    tokenizer, side = processor.tokenizer, processor.tokenizer.padding_side
    tokenizer.padding_side = "right"  # training rows: padding after the reply (the saved side is kept)
    inputs = processor(text=texts, images=images, return_tensors="pt", padding=True)
    prompt_lengths = processor(text=prompts, images=images, padding=True)["attention_mask"]
    tokenizer.padding_side = side
    prompt_lengths = [sum(row) for row in prompt_lengths]  # the image tokens expanded, as in ``inputs``
    labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
    for row, length in enumerate(prompt_lengths):
        labels[row, :length] = -100  # the prompt (image tokens included) is never a target
    return {**inputs, "labels": labels}


def reply_loss(model, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean next-token cross-entropy over the reply tokens (``labels`` ≠ −100), the LM head run on those
    positions only: the prompt's (most of a row) never reach the 49k-way softmax."""
    labels = inputs.pop("labels")
    hidden = model.model(**inputs).last_hidden_state  # [B, L, d]
    targets = labels[:, 1:]  # [B, L-1]: position t predicts token t + 1
    scored = targets != -100
    logits = model.lm_head(hidden[:, :-1][scored]).float()  # [N, V]
    return torch.nn.functional.cross_entropy(logits, targets[scored])


def cell_targets(tokenizer, batch: Sequence[Example]) -> torch.Tensor:
    """The first token of each image cell's word (row by row; a space for an empty cell): [B * cells]."""
    words = {word for example in batch for word in example.fields["cells"]}
    first = {word: tokenizer.encode(word or " ", add_special_tokens=False)[0] for word in words}
    return torch.tensor([first[word] for example in batch for word in example.fields["cells"]])


def align_connector(model, processor, examples, settings: VLMBuildRun, advance) -> list[float]:
    """Stage 4: the connector, rescaled to the language model's scale, and the encoder learn to put each
    image token where the language model reads its cell's word: cross-entropy of the token's scores against
    every token embedding (the language model frozen); returns the per-step losses."""
    match_connector_scale(model, processor, next(batches(examples, 4 * settings.batch_size, settings.seed + 3)))
    vision, connector = model.model.vision_model, model.model.connector
    parameters = [*vision.parameters(), *connector.parameters()]
    embeddings = model.model.text_model.get_input_embeddings().weight.detach()  # [V, d]
    optimizer = torch.optim.AdamW(parameters, lr=settings.lr, weight_decay=0.0)
    losses = []
    vision.train()
    for batch in itertools.islice(batches(examples, 4 * settings.batch_size, settings.seed + 3), settings.align_steps):
        pixels = processor.image_processor([[e.images[0]] for e in batch], return_tensors="pt")["pixel_values"][:, 0]
        tokens = connector(vision(pixel_values=pixels).last_hidden_state)  # [B, cells, d]
        scores = tokens.reshape(-1, tokens.shape[-1]) @ embeddings.T  # [B * cells, V]
        loss = torch.nn.functional.cross_entropy(scores.float(), cell_targets(processor.tokenizer, batch))
        losses.append(optimizer_step(loss, optimizer, parameters))
        advance(1)
    vision.eval()
    return losses


def supervised_fine_tuning(model, processor, examples, settings: VLMBuildRun, advance) -> list[float]:
    """Stage 5: everything trained on the visual questions (the language model at its own learning rate):
    next-token loss on the answers; returns the per-step losses."""
    language_parts = [*model.model.text_model.parameters(), *model.lm_head.parameters()]
    language = list({id(p): p for p in language_parts}.values())  # a tied LM head counted once
    new = [*model.model.connector.parameters(), *model.model.vision_model.parameters()]
    groups = [{"params": new, "lr": settings.adapter_lr}, {"params": language, "lr": settings.language_model_lr}]
    trained = {id(p) for group in groups for p in group["params"]}
    for parameter in model.parameters():
        parameter.requires_grad_(id(parameter) in trained)
    optimizer = torch.optim.AdamW(groups, weight_decay=0.0)
    dtype, losses = compute_dtype("auto"), []
    model.train()
    for batch in itertools.islice(batches(examples, settings.batch_size, settings.seed + 1), settings.sft_steps):
        with autocast_context(dtype, torch.device("cpu")):
            loss = reply_loss(model, supervised_batch(processor, batch, "answer"))
        losses.append(optimizer_step(loss, optimizer, [p for group in groups for p in group["params"]]))
        advance(1)
    model.eval()
    model.requires_grad_(True)
    return losses


def build_directory(settings: VLMBuildRun) -> Path:
    """Where a recipe's VLM is cached: one directory per recipe (its settings' fingerprint); the default recipe's
    is the one ``reasonrl.models.load.BUILT_VLMS`` names ``smollm2-135m-vlm``."""
    recipe = json.dumps({k: v for k, v in sorted(vars(settings).items()) if k != "out"})
    return cache_root() / "models" / f"vlm-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"


def build_vlm(settings: VLMBuildRun, out: Path, progress: bool | None = False) -> dict:
    """Assemble, run the four training stages, save the model and its processor to ``out``; returns the build's
    summary (also in ``out/build.json``): each stage's first and last losses and seconds.  ``progress``: show
    the steps on stderr (``reasonrl.timing.Progress``'s ``show``)."""
    started = time.perf_counter()
    examples = [e for task in settings.tasks.split(",") for e in load_examples(task.strip(), "train")]
    model, processor = assemble(settings)
    stages: dict[str, dict] = {}
    total = settings.encoder_steps + settings.contrastive_steps + settings.align_steps + settings.sft_steps
    with Progress("vlm build", progress) as shown:
        shown.stage("", total, "steps")
        for stage, run in (
            ("encoder", lambda: pretrain_encoder(model, processor, examples, settings, shown.advance)),
            ("contrastive", lambda: contrast_images_and_captions(model, processor, examples, settings, shown.advance)),
            ("align", lambda: align_connector(model, processor, examples, settings, shown.advance)),
            ("sft", lambda: supervised_fine_tuning(model, processor, examples, settings, shown.advance)),
        ):
            begun = time.perf_counter()
            shown.phase(stage)
            losses = run()
            head, tail = losses[: max(1, len(losses) // 10)], losses[-max(1, len(losses) // 10) :]
            stages[stage] = {"steps": len(losses), "loss_first": sum(head) / len(head) if losses else None,
                             "loss_last": sum(tail) / len(tail) if losses else None,
                             "seconds": time.perf_counter() - begun}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    summary = {
        "settings": vars(settings),
        "parameters": sum(p.numel() for p in model.parameters()),
        "vision_parameters": sum(p.numel() for p in model.model.vision_model.parameters()),
        "stages": stages,
        "wall_seconds": time.perf_counter() - started,
        "out": str(out),
    }
    (out / "build.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def run_vlm_build(settings: VLMBuildRun, progress: bool | None = False) -> dict:
    """``reasonrl vlm build``: the VLM built into ``settings.out``, or without one into the reasonrl cache,
    once (a complete build there is kept; its summary is returned), where ``model.name_or_path=smollm2-135m-vlm``
    finds the default recipe's; returns the build's summary."""
    if settings.out is not None:
        return build_vlm(settings, Path(settings.out), progress)
    cached = build_directory(settings)
    if not (cached / COMPLETE_MARKER).exists():
        build_vlm(settings, cached, progress)
        (cached / COMPLETE_MARKER).touch()  # what the model loader asks before it reads a built model
    return json.loads((cached / "build.json").read_text())
