"""Chat formats: how a list of role/content messages becomes one token sequence.

Every tokenizer renders chats through a `ChatFormat`, a small declarative
description (prefix and suffix around each message, the generation prompt,
an optional default system message). Jinja templates shipped with real
checkpoints are read into a `ChatFormat` when they follow a simple known
shape (ChatML, Llama-3 headers); anything else falls back to a default.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from collections.abc import Callable, Sequence

Message = dict[str, str]


@dataclasses.dataclass(frozen=True)
class ChatFormat:
    """A chat rendering: `conversation_prefix`, then per message
    `message_prefix + content [+ EOS id] + message_suffix`, then `generation_prompt`.

    `message_prefix` may use `{role}` (as given) and `{Role}` (title case).
    `default_system` is inserted as a first system message when the chat has none.
    `eos_after_message` appends the tokenizer's EOS id after each message's
    content (for vocabularies whose EOS is a control id that no text encodes to,
    such as SentencePiece `</s>`), so a model trained on rendered chats learns to stop.
    `trim_content` strips whitespace around each message's content, as Llama-3's template does (`| trim`).
    """

    message_prefix: str
    message_suffix: str
    generation_prompt: str
    conversation_prefix: str = ""
    default_system: str | None = None
    eos_after_message: bool = False
    trim_content: bool = False

    def prefix_for(self, role: str) -> str:
        return self.message_prefix.format(role=role, Role=role.title())

    def render_text(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        """The chat as text (EOS ids, which have no text form, are omitted)."""
        return "".join(
            seg for seg in self.segments(messages, add_generation_prompt) if isinstance(seg, str)
        )

    def segments(self, messages: Sequence[Message], add_generation_prompt: bool) -> list[str | None]:
        """Text pieces in order; `None` marks where an EOS id goes."""
        _check_messages(messages)
        messages = list(messages)
        if self.default_system is not None and (not messages or messages[0]["role"] != "system"):
            messages.insert(0, {"role": "system", "content": self.default_system})
        out: list[str | None] = [self.conversation_prefix]
        for message in messages:
            content = message["content"].strip() if self.trim_content else message["content"]
            out.append(self.prefix_for(message["role"]) + content)
            if self.eos_after_message:
                out.append(None)
            out.append(self.message_suffix)
        if add_generation_prompt:
            out.append(self.generation_prompt)
        return [seg for seg in out if seg != ""]

    def render_ids(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool,
        encode: Callable[[str], list[int]],
        eos_id: int,
    ) -> list[int]:
        """Token ids of the chat. Text between EOS ids is encoded as one string."""
        ids: list[int] = []
        pending = ""
        for seg in self.segments(messages, add_generation_prompt):
            if seg is None:
                ids += encode(pending) if pending else []
                ids.append(eos_id)
                pending = ""
            else:
                pending += seg
        if pending:
            ids += encode(pending)
        return ids


def _check_messages(messages: Sequence[Message]) -> None:
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise TypeError(f"chat message {i} must be a dict with 'role' and 'content', got {message!r}")
        if not isinstance(message["content"], str):
            raise TypeError(f"chat message {i} content must be a string, got {type(message['content']).__name__}")


# Plain-text role markers for tokenizers trained here (SentencePiece): no
# reserved pieces needed, and `</s>` after each message teaches stopping.
PLAIN_TEXT_CHAT = ChatFormat(
    message_prefix="{Role}: ",
    message_suffix="\n",
    generation_prompt="Assistant: ",
    eos_after_message=True,
)

# ChatML, as used by SmolLM2 and Qwen: `<|im_start|>role\ncontent<|im_end|>\n`.
CHATML = ChatFormat(
    message_prefix="<|im_start|>{role}\n",
    message_suffix="<|im_end|>\n",
    generation_prompt="<|im_start|>assistant\n",
)

# Llama-3 headers, contents trimmed as its template does, without the dated default system message of
# Llama-3.1 and later (their prompts differ from this one in that system block).
LLAMA3_CHAT = ChatFormat(
    message_prefix="<|start_header_id|>{role}<|end_header_id|>\n\n",
    message_suffix="<|eot_id|>",
    generation_prompt="<|start_header_id|>assistant<|end_header_id|>\n\n",
    conversation_prefix="<|begin_of_text|>",
    trim_content=True,
)

# A fixed default system message written as one string literal inside a
# ChatML template, e.g. `'<|im_start|>system\nYou are ...<|im_end|>\n'`.
# The newline may be a real one or a `\n` escape inside the Jinja literal.
_CHATML_DEFAULT_SYSTEM = re.compile(r"'<\|im_start\|>system(?:\n|\\n)([^'{}+]*?)<\|im_end\|>")


def template_generation_prompt(template: str) -> str | None:
    """What a Jinja chat template appends for `add_generation_prompt=True` after a one-message chat,
    rendered as transformers renders templates (a sandbox with trim_blocks and lstrip_blocks); None
    when jinja2 is missing or the template does not render that way."""
    try:
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        return None

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def strftime_now(format: str) -> str:
        return datetime.datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    probe = [{"role": "user", "content": "Hi"}]
    try:
        compiled = env.from_string(template)
        with_prompt, without = (compiled.render(messages=probe, add_generation_prompt=flag, tools=None,
                                                documents=None, bos_token="", eos_token="")
                                for flag in (True, False))
    except Exception:  # noqa: BLE001 - any template the sandbox cannot render keeps the default
        return None
    if not with_prompt.startswith(without) or len(with_prompt) == len(without):
        return None
    return with_prompt[len(without):]


def chat_format_from_template(template: str | None) -> ChatFormat | None:
    """Read a Jinja chat template of a simple known shape into a `ChatFormat`.

    Recognises ChatML (with a fixed default system message if the template
    inserts one) and Llama-3 header templates; returns None for anything else,
    so callers can choose their own default.
    """
    if not template:
        return None
    if "<|im_start|>" in template and "<|im_end|>" in template:
        match = _CHATML_DEFAULT_SYSTEM.search(template)
        default_system = match.group(1).replace("\\n", "\n") if match else None
        # The generation prompt exactly as the template writes it (Qwen3-Thinking's ends in "<think>\n").
        prompt = template_generation_prompt(template) or CHATML.generation_prompt
        return dataclasses.replace(CHATML, default_system=default_system, generation_prompt=prompt)
    if "<|start_header_id|>" in template and "<|eot_id|>" in template:
        return LLAMA3_CHAT
    return None
