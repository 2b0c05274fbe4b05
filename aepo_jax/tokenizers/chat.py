"""Chat formats: how a list of role/content messages becomes one token sequence.

Every tokenizer renders chats through a `ChatFormat`, a small declarative
description (prefix and suffix around each message, the generation prompt,
an optional default system message). Jinja templates shipped with real
checkpoints are read into a `ChatFormat` when they follow a simple known
shape (ChatML, Llama-3 headers, Llama-3.1's dated system block); anything else
falls back to a default. `template_differences` names what a read format
renders otherwise than the template does (for a load-time warning).
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
    `system_preamble` goes before the content of a chat's first message when that is a system one (Llama-3.1's
    knowledge-cutoff and date lines); with `default_system=""` the block is there even when the chat has none.
    """

    message_prefix: str
    message_suffix: str
    generation_prompt: str
    conversation_prefix: str = ""
    default_system: str | None = None
    eos_after_message: bool = False
    trim_content: bool = False
    system_preamble: str = ""

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
        for i, message in enumerate(messages):
            content = message["content"].strip() if self.trim_content else message["content"]
            if i == 0 and message["role"] == "system":
                content = self.system_preamble + content
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

# Llama-3 headers, contents trimmed as its template does. Llama-3.1 and later add a dated system block
# (`llama31_chat_format`).
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


def render_template(template: str, messages: Sequence[Message], add_generation_prompt: bool, *,
                    bos_token: str = "", clock: bool = True) -> str | None:
    """A Jinja chat template rendered as transformers renders it (a sandbox with trim_blocks, lstrip_blocks, loop
    controls, `raise_exception`, `tools=None`, and `strftime_now` unless `clock` is False, when a template falls
    back to its own default date); None when jinja2 is missing or the template does not render."""
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
    if clock:
        env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(template).render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                                tools=None, documents=None, bos_token=bos_token, eos_token="")
    except Exception:  # noqa: BLE001 - any template the sandbox cannot render: the caller keeps its default
        return None


def template_generation_prompt(template: str) -> str | None:
    """What a Jinja chat template appends for `add_generation_prompt=True` after a one-message chat,
    rendered as transformers renders templates (`render_template`); None when jinja2 is missing or the
    template does not render that way."""
    probe = [{"role": "user", "content": "Hi"}]
    with_prompt, without = (render_template(template, probe, flag) for flag in (True, False))
    if with_prompt is None or without is None:
        return None
    if not with_prompt.startswith(without) or len(with_prompt) == len(without):
        return None
    return with_prompt[len(without):]


# Llama-3.1 and later open every chat with a system block whose first lines are written as Jinja string
# literals: `"Cutting Knowledge Date: December 2023\n"` and `"Today Date: " + date_string + "\n\n"`,
# `date_string` defaulting to a literal (`{%- set date_string = "26 Jul 2024" %}`). A `\n` may be an escape
# inside the literal or a real newline.
_LLAMA31_MARKER = "Cutting Knowledge Date"
_KNOWLEDGE_CUTOFF = re.compile(r"""["']Cutting Knowledge Date: ([^"'\\\n]+)(?:\\n|\n)["']""")
_TODAY_LINE = re.compile(r"""["']Today Date: ["']\s*\+\s*date_string\s*\+\s*["'](?:\\n|\n){2}["']""")
_DEFAULT_DATE = re.compile(r"""set date_string = (["'])([^"']+)\1""")
# Llama-3.2's template dates the block `strftime_now("%d %b %Y")` when the renderer defines it (transformers does).
_DATE_FROM_CLOCK = re.compile(r"date_string\s*=\s*strftime_now")


def llama31_system_preamble(template: str) -> str | None:
    """The lines a Llama-3.1-family template writes at the top of its system block, with the template's
    default date (never today's: a prompt must not change from day to day); None when they cannot be read."""
    cutoff, date = _KNOWLEDGE_CUTOFF.search(template), _DEFAULT_DATE.search(template)
    if cutoff is None or date is None or _TODAY_LINE.search(template) is None:
        return None
    return f"Cutting Knowledge Date: {cutoff.group(1)}\nToday Date: {date.group(2)}\n\n"


def llama31_chat_format(template: str) -> ChatFormat | None:
    """Llama-3 headers plus the dated system block Llama-3.1 and later always write (an empty system
    message when the chat has none), for the no-tools chats rendered here; None if the block is unreadable."""
    preamble = llama31_system_preamble(template)
    if preamble is None:
        return None
    return dataclasses.replace(LLAMA3_CHAT, default_system="", system_preamble=preamble)


def template_differences(template: str | None) -> list[str]:
    """What chats rendered with `chat_format_from_template(template)` have otherwise than the template's own
    rendering in transformers, in words (empty when none is known): a loader warns with these. Checked for
    Llama-3.1-family templates, whose dated system block is read from the template's text."""
    known = chat_format_from_template(template)
    if known is None or _LLAMA31_MARKER not in template:
        return []
    notes = []
    if not known.system_preamble:
        notes.append("its system block's 'Cutting Knowledge Date' / 'Today Date' lines could not be read, so they "
                     "are left out (the chat is rendered as plain Llama-3)")
    elif _DATE_FROM_CLOCK.search(template):
        date = known.system_preamble.split("Today Date: ", 1)[1].strip()
        notes.append(f"transformers writes today's date in its system block ('Today Date: ' + strftime_now); here "
                     f"the template's fixed default {date!r} is written instead, so prompts do not change from day "
                     f"to day")
    mismatch = _probe_mismatch(template, known)
    if mismatch is not None:
        notes.append(mismatch)
    return notes


# Chats a read format is checked on against its template: a system message with whitespace the template may
# trim, several turns, and a chat without a system message.
_PROBE_CHATS = (
    [{"role": "system", "content": " Be brief.\n"}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "2+2?"}],
    [{"role": "user", "content": "Hi"}],
)


def _probe_mismatch(template: str, known: ChatFormat) -> str | None:
    """Where `known` renders a probe chat otherwise than `template` does (with its default date, not the
    clock's, which `template_differences` reports apart); None when they agree or jinja2 cannot render it."""
    for messages in _PROBE_CHATS:
        for generation_prompt in (True, False):
            theirs = render_template(template, messages, generation_prompt, bos_token=known.conversation_prefix,
                                     clock=False)
            ours = known.render_text(messages, generation_prompt)
            if theirs is not None and theirs != ours:
                at = next((i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b), min(len(theirs), len(ours)))
                return (f"on a probe chat the template writes {theirs[at:at + 60]!r} where this library writes "
                        f"{ours[at:at + 60]!r} (after {ours[max(0, at - 40):at]!r})")
    return None


def chat_format_from_template(template: str | None) -> ChatFormat | None:
    """Read a Jinja chat template of a simple known shape into a `ChatFormat`.

    Recognises ChatML (with a fixed default system message if the template
    inserts one), Llama-3 header templates and Llama-3.1's (its dated system
    block included); returns None for anything else, so callers can choose
    their own default. `template_differences` says where the result differs.
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
        dated = llama31_chat_format(template) if _LLAMA31_MARKER in template else None
        return dated or LLAMA3_CHAT
    return None
