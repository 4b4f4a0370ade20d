"""Tool calls in the chat template's own format, read from a policy turn, and the tools that answer them.

Two formats, both always read (the one the model's template renders is the one it is trained to write):
- Hermes (Qwen2.5/3, SmolLM3, Hermes models): each ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  block of the turn is a call, wherever it stands (reasoning before it, text after it stay in the turn); several
  blocks are several calls, in order (Qwen models call in parallel);
- Llama 3 (3.1-3.3 JSON tool calling): the whole turn is one JSON object ``{"name": ..., "parameters": {...}}``
  (the ``<|python_tag|>`` the model may emit first is a special token, not in the decoded text).

A call's name and arguments come from generated text: untrusted data.  They are parsed as JSON (never
evaluated), checked against the tool's parameter schema (the required names, no others, each value fitting its
schema: ``fits_schema``), and only then passed to the tool's function, which is the environment's own code.  A
call that cannot be read, names no tool or has bad arguments is answered with an error message, never an error
of the run.  Parsing takes time linear in the text and never raises.

A chat template without a tool-call format (SmolLM2's) drops ``tools=``; ``with_tool_prompt`` writes the tools
and the Hermes call into the chat's system message instead.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from reasonrl.rollout.multiturn.episodes import OutOfTime

HERMES_CALL = ("<tool_call>", "</tool_call>")
LLAMA_CALL = re.compile(r'\s*\{\s*"name"\s*:')  # a turn that opens a JSON object with a name: a Llama 3 call
CALL_FORMAT_ERROR = (
    'Error: a tool call is one JSON object {"name": <tool>, "arguments": {<name>: <value>, ...}}, '
    "in <tool_call></tool_call>"
)
TOOL_OUTPUT_CHARS = 1000  # a tool's output is cut to this many characters before it is injected
TOOL_NAME_CHARS = 100  # a name a call gives is cut to this many characters where it is shown (untrusted text)
JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def native_tool_format(tokenizer) -> Literal["hermes", "llama3"] | None:
    """The tool-call format of the tokenizer's chat template, or None where it has none: ``hermes`` where it
    renders ``tools`` and ``<tool_call>`` blocks (Qwen2.5/3, SmolLM3, Hermes models), ``llama3`` where it
    renders ``tools`` and tool results as ``ipython`` turns (Llama 3.1-3.3).  SmolLM2's has none."""
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    if "tools" not in template:
        return None
    if "<tool_call>" in template:
        return "hermes"
    return "llama3" if "ipython" in template else None


def hermes_tool_prompt(tools: Sequence[dict]) -> str:
    """The tools and how to call them, for a system prompt, in the Hermes format ``function_calls`` reads (as
    Qwen2.5's chat template writes them): each function schema as JSON in ``<tools></tools>``, then the call."""
    schemas = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{schemas}\n</tools>"
        "\n\nFor each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
        "\n</tool_call>"
    )


def with_tool_prompt(messages: Sequence[dict[str, str]], tools: Sequence[dict]) -> list[dict[str, str]]:
    """The chat with the tools written into its system message (``hermes_tool_prompt``): after what its first
    message says when that is a system message, else as a system message of their own before the chat."""
    chat, prompt = [dict(message) for message in messages], hermes_tool_prompt(tools)
    if chat and chat[0]["role"] == "system":
        chat[0]["content"] = f"{chat[0]['content']}\n\n{prompt}"
        return chat
    return [{"role": "system", "content": prompt}, *chat]


def block_ending(text: str, opening: str, closing: str) -> str | None:
    """What lies between the first ``opening`` and the ``closing`` that ends ``text`` (trailing whitespace
    allowed), or None.  Two string searches: a lazy regex tried from every opening is quadratic."""
    body = text.rstrip()
    if not body.endswith(closing):
        return None
    body = body[: -len(closing)]
    start = body.find(opening)
    return None if start < 0 else body[start + len(opening) :]


def blocks(text: str, opening: str, closing: str) -> list[str]:
    """What lies inside each complete ``opening`` ... ``closing`` block of ``text``, in order (an opening without
    its closing opens none).  String searches that only move forward: time linear in the text."""
    found, start = [], text.find(opening)
    while start >= 0:
        end = text.find(closing, start + len(opening))
        if end < 0:
            break
        found.append(text[start + len(opening) : end])
        start = text.find(opening, end + len(closing))
    return found


@dataclass(frozen=True)
class FunctionCall:
    """A function call of a policy turn: the tool's name and its arguments (untrusted JSON values), or why the
    call cannot be read (``error``, the message the model gets)."""

    name: str
    arguments: dict[str, Any]
    error: str = ""


def function_calls(text: str) -> list[FunctionCall]:
    """The function calls of a turn, in order: each complete Hermes block, else the whole turn as one Llama 3
    call; [] where it makes none (the turn is an answer).  A block or turn that is a call but not its JSON
    (malformed, too deep, a number past any float, a lone surrogate, a wrong shape) is a call whose ``error``
    says what a call looks like."""
    payloads = blocks(text, *HERMES_CALL) or ([text] if LLAMA_CALL.match(text) else [])
    return [read_call(payload) for payload in payloads]


def read_call(payload: str) -> FunctionCall:
    """The call a block's JSON makes, or an unreadable call (``CALL_FORMAT_ERROR``); never raises."""
    try:
        name, arguments = _name_and_arguments(payload.strip())
    except Exception:  # whatever the JSON makes the decoder raise (deep nesting: RecursionError) is a bad call
        return FunctionCall("", {}, CALL_FORMAT_ERROR)
    return FunctionCall(name, arguments)


def _name_and_arguments(payload: str) -> tuple[str, dict[str, Any]]:
    """A call's name and arguments (an object, or an object as a JSON string; Llama's "parameters" too);
    raises unless both are there, of their types, and every string in them is valid unicode."""
    call = json.loads(payload)
    arguments = call.get("arguments", call.get("parameters", {}))
    arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
    name = call["name"]
    if not isinstance(name, str) or not isinstance(arguments, dict):
        raise TypeError("a call is a name and an object of arguments")
    json.dumps([name, arguments], ensure_ascii=False).encode()  # a lone surrogate cannot be encoded
    return name, arguments


@dataclass(frozen=True)
class ToolOutput:
    """What a tool call printed, or the error message in its place; ``failed`` when the call crashed, timed
    out, flooded its output, could not be read or never ran."""

    text: str
    failed: bool = False


@dataclass(frozen=True)
class FunctionTool:
    """A tool an environment offers: its schema, rendered into the prompt by the chat template's ``tools=``, and
    its function (the environment's code, trusted), called with checked arguments as keywords."""

    name: str
    description: str
    parameters: Mapping[str, Mapping[str, Any]]  # argument -> its JSON schema ({"type": ..., "description": ...})
    function: Callable[..., ToolOutput]
    required: tuple[str, ...] | None = None  # the arguments a call must give; None: all of them

    @classmethod
    def from_schema(cls, schema: Mapping[str, Any], function: Callable[..., ToolOutput]) -> FunctionTool:
        """The tool a function schema describes (``{"type": "function", "function": {...}}``, as transformers'
        ``get_json_schema`` writes it), answered by ``function``."""
        spec = schema["function"]
        parameters = spec.get("parameters") or {}
        properties, required = parameters.get("properties") or {}, tuple(parameters.get("required") or ())
        return cls(spec["name"], spec.get("description", ""), properties, function, required)

    @property
    def schema(self) -> dict:
        """The function schema ``apply_chat_template(tools=...)`` renders."""
        properties = {name: dict(spec) for name, spec in self.parameters.items()}
        required = list(properties if self.required is None else self.required)
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {"type": "object", "properties": properties, "required": required},
            },
        }

    def argument_error(self, arguments: Mapping[str, Any]) -> str:
        """Why ``arguments`` do not fit the schema ("" when they do): a missing or unknown name, a wrong type."""
        required = self.parameters if self.required is None else self.required
        missing = [name for name in required if name not in arguments]
        unknown = [name for name in arguments if name not in self.parameters]
        if missing or unknown:
            expected = ", ".join(self.parameters) or "none"
            return f"Error: {self.name} takes the arguments {expected}; got {', '.join(map(repr, arguments)) or 'none'}"
        for name, value in arguments.items():
            spec = self.parameters[name]
            if not fits_schema(value, spec):
                kind = spec.get("type")
                if isinstance(kind, str) and spec.keys() <= {"type", "description"}:
                    return f"Error: the argument {name} of {self.name} is a {kind}"
                shape = json.dumps({key: rule for key, rule in spec.items() if key != "description"})
                return f"Error: the argument {name} of {self.name} must fit the schema {shape}"
        return ""


def fits_schema(value: Any, spec: Mapping[str, Any]) -> bool:
    """Whether a JSON value fits a parameter's schema, in the terms ``get_json_schema`` writes: its ``type`` (a
    name or a list of names), ``nullable``, ``enum``, ``anyOf``, an array's ``items`` / ``prefixItems``, an
    object's ``additionalProperties``.  A type it does not know (an image) fits nothing."""
    if value is None and spec.get("nullable"):
        return True
    if "anyOf" in spec and not any(fits_schema(value, option) for option in spec["anyOf"]):
        return False
    if "enum" in spec and not any(value == v and type(value) is type(v) for v in spec["enum"]):
        return False
    kinds = [spec["type"]] if isinstance(spec.get("type"), str) else spec.get("type", [])
    if kinds and not any(is_json_type(value, kind) for kind in kinds):
        return False
    if isinstance(value, list):
        fixed = spec.get("prefixItems")
        if fixed is not None and (len(value) != len(fixed) or not all(map(fits_schema, value, fixed))):
            return False
        return all(fits_schema(item, spec["items"]) for item in value) if "items" in spec else True
    if isinstance(value, dict) and "additionalProperties" in spec:
        return all(fits_schema(item, spec["additionalProperties"]) for item in value.values())
    return True


def is_json_type(value: Any, kind: str) -> bool:
    """Whether a JSON value is of the JSON type ``kind`` (true is no number; infinities are no JSON)."""
    boolean = isinstance(value, bool) and kind in ("integer", "number")
    infinite = isinstance(value, float) and not math.isfinite(value)
    return not boolean and not infinite and isinstance(value, JSON_TYPES.get(kind, ()))


def call_tool(tools: Mapping[str, FunctionTool], call: FunctionCall) -> ToolOutput:
    """Answer ``call`` with the tool it names: the tool's output, or an error message (the call unreadable, no
    such tool, arguments that do not fit, the function raising); raises only the function's ``OutOfTime`` (an
    async function past the environment's time), which ends the episode."""
    if call.error:
        return ToolOutput(call.error, failed=True)
    tool = tools.get(call.name)
    if tool is None:
        name = call.name[:TOOL_NAME_CHARS]
        return ToolOutput(f"Error: there is no tool {name!r}; the tools are {', '.join(tools)}", failed=True)
    if error := tool.argument_error(call.arguments):
        return ToolOutput(error, failed=True)
    try:
        return tool.function(**call.arguments)
    except OutOfTime:  # the episode's time is up: it ends, as the driver's budget says
        raise
    except Exception as exc:  # the environment's function failing on odd input is the call's error, not the run's
        return ToolOutput(f"Error: {type(exc).__name__}: {exc}", failed=True)
