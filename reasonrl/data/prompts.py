"""Prompt templates that ask for a parseable final answer, rendered through the tokenizer's chat template."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Literal

from reasonrl.batch import ImagePrompt
from reasonrl.data.control_tokens import control_tokens
from reasonrl.data.examples import Example

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from reasonrl.data.examples import Example

log = logging.getLogger(__name__)

PromptTemplate = Literal["answer_line", "boxed", "plain"]
TEMPLATES: dict[str, str] = {
    # the final line "Answer: <answer>" is what the math verifier looks for first (after \boxed{})
    "answer_line": "{question} Give the final answer on the last line as 'Answer: <answer>'.",
    "boxed": "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}.",
    "plain": "{question}",
}


def user_message(question: str, template: PromptTemplate) -> str:
    """The user turn for ``question`` in the given template."""
    return TEMPLATES[template].format(question=question)


def prompt_messages(
    example: Example, template: PromptTemplate, system_prompt: str | None = None
) -> list[dict[str, str]]:
    """The conversation that asks ``example``: its chat-format prompt as it is, else its question through
    the template; ``system_prompt`` goes first unless the conversation already starts with a system message."""
    messages = [dict(m) for m in example.messages] or [
        {"role": "user", "content": user_message(example.question, template)}
    ]
    if system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def prompt_token_ids(tokenizer: PreTrainedTokenizerBase, question: str, template: PromptTemplate) -> list[int]:
    """Chat-formatted prompt ids ending with the assistant header, ready for generation."""
    return chat_token_ids(tokenizer, [{"role": "user", "content": user_message(question, template)}])


def chat_token_ids(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, str]],
    tools: list[dict] | None = None,
    generation_prompt: bool = True,
) -> list[int]:
    """A conversation through the chat template (with the function schemas ``tools``, where given), ending
    with the assistant header unless ``generation_prompt`` is False (plain text without a template).  The
    contents are untrusted: a control token they spell is encoded as plain text (``data/control_tokens.py``)."""
    controls = control_tokens(tokenizer)
    if tokenizer.chat_template:
        return controls.encode(controls.render(messages, tools, generation_prompt))
    return controls.encode("\n\n".join(controls.mark(m["content"]) for m in messages), add_special_tokens=True)


def text_token_ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Untrusted ``text`` by itself (a response a reward model reads after its prompt), as plain text."""
    return control_tokens(tokenizer).text_ids(text)


class PromptEncoder:
    """Chat-formatted prompt ids per example, cached; over-long prompts are reported, never cut.  ``tools``:
    function schemas the chat template renders into every prompt (a tool rollout on a template with a
    tool-call format)."""

    def __init__(
        self,
        tokenizer,
        template: str,
        max_prompt_tokens: int,
        system_prompt: str | None = None,
        tools: list[dict] | None = None,
        processor=None,
    ) -> None:
        self.tokenizer = tokenizer
        self.processor = processor  # a vision-language model's: prompts with images become ImagePrompts
        self.template = template
        self.max_prompt_tokens = max_prompt_tokens
        self.system_prompt = system_prompt
        self.tools = tools
        self._cache: dict[str, list[int]] = {}
        self.too_long = 0

    def messages(self, example: Example) -> list[dict[str, str]]:
        """The chat that asks ``example``, as the prompt ids render it."""
        # the template asks for a parseable final answer: math only (code and chat questions carry their own)
        template = self.template if example.task_type == "math" else "plain"
        return prompt_messages(example, template, self.system_prompt)

    def __call__(self, example: Example) -> list[int] | None:
        """The prompt ids, or None (with a warning) when the prompt is longer than ``max_prompt_tokens``."""
        if example.images and self.processor is None:
            from reasonrl.data.loaders import DataError

            raise DataError(
                f"prompt {example.id} shows images, which a text-only model cannot see; train or evaluate a "
                "vision-language model on it, or choose a text dataset"
            )
        if example.id not in self._cache:
            if example.images:
                ids = self._image_prompt(example)
            else:
                ids = chat_token_ids(self.tokenizer, self.messages(example), self.tools)
            self._cache[example.id] = ids
            if len(ids) > self.max_prompt_tokens:
                self.too_long += 1
                log.warning(
                    "skipping prompt %s: %d tokens > rollout.max_prompt_tokens=%d (%d skipped so far)",
                    example.id,
                    len(ids),
                    self.max_prompt_tokens,
                    self.too_long,
                )
        ids = self._cache[example.id]
        return ids if len(ids) <= self.max_prompt_tokens else None

    def _image_prompt(self, example: Example) -> ImagePrompt:
        """The chat with the example's images before the text of its last user message, through the
        processor: image tokens in the ids, pixel inputs beside them."""
        messages = self.messages(example)
        last = messages[-1]
        images = [{"type": "image"} for _ in example.images]
        messages[-1] = {"role": last["role"], "content": [*images, {"type": "text", "text": last["content"]}]}
        controls = control_tokens(self.processor.tokenizer)
        marked = controls.mark_messages(messages)
        text = self.processor.apply_chat_template(marked, add_generation_prompt=True, tokenize=False)
        inputs = {}

        def encode(text: str) -> list[int]:
            inputs.update(self.processor(text=[text], images=[list(example.images)], return_tensors="pt"))
            return inputs["input_ids"][0].tolist()

        ids = controls.encode_through(text, encode)  # a control token the question spells is text, not an image
        vision = {k: v[0] for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
        return ImagePrompt(ids, vision, example.images)
