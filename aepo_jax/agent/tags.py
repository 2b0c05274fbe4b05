"""The agent tag vocabulary of spec section 4, shared by tokenizers, protocol and rollouts."""

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
RESULT_OPEN, RESULT_CLOSE = "<result>", "</result>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"

# Tools the agent can call, by tag name. A segment of generation stops at any closing tag.
TOOL_TAGS: tuple[str, ...] = ("search", "python", "browse")


def open_tag(name: str) -> str:
    """`<name>`."""
    return f"<{name}>"


def close_tag(name: str) -> str:
    """`</name>`."""
    return f"</{name}>"


TOOL_CLOSE_TAGS: tuple[str, ...] = tuple(close_tag(t) for t in TOOL_TAGS)

# Every tag, in the order they are registered as special tokens.
AGENT_SPECIAL_TOKENS: tuple[str, ...] = (
    THINK_OPEN,
    THINK_CLOSE,
    *(tag for name in TOOL_TAGS for tag in (open_tag(name), close_tag(name))),
    RESULT_OPEN,
    RESULT_CLOSE,
    ANSWER_OPEN,
    ANSWER_CLOSE,
)
