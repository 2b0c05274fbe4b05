"""A multi-step demo task: follow a town's path of words to its goal, one search per step (2-4 steps).

Each town hides a path of 2-4 distinct words from `PATH_WORDS`, one corpus
document per word, titled "Kraiford ruby": "ruby leads to lion." or, for the
last one, "owl is the goal." (short: every result is read by the model). A question gives the town and the first word
("In Kraiford, start at ruby and follow the path. Which word is the goal?");
the agent searches "Kraiford ruby", reads the next word, searches
"Kraiford lion", ... until a result says "is the goal", and answers
`\\boxed{ owl}`. Every step is a tool step where a decision (search on or
answer) matters, so the tree strategies have several places to branch.

Why it suits the tiny demo model: the path words are frequent in the
tokenizer's text, so each is one SentencePiece piece (after a space, as it
stands in queries, results and answers) and copying the next word is one
token; the town name is the same in every query and is copied from the
question, as in the towns task (names are masked out of the tokenizer text
so they spell with shared syllable pieces). The words are shared by all
towns, so every word is trained as an output; the paths are per town and
held-out towns are disjoint from train towns, so a path cannot be memorised.

The scripted SFT trajectories have a flaw RL can remove: with probability
`early_answer_prob` a script answers right after its first search with the
word that result leads to, without checking that it is the goal (right only
for 2-step paths).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np

from aepo_jax.agent.protocol import format_tool_result
from aepo_jax.envs.synthetic_facts import generate_towns, invent_names
from aepo_jax.tools.search import format_passages

PATH_WORDS = (
    "ruby", "lion", "owl", "fox", "oak", "elm", "bell", "drum", "kite", "moon", "star", "lake", "rose", "wolf",
    "bear", "hawk", "crab", "frog", "goat", "lamb", "swan", "toad", "wren", "ash", "fig", "ivy", "jade", "opal",
    "pearl", "reed", "sage", "coal", "iron", "salt", "silk", "wool", "corn", "rice", "plum", "pine",
)
MULTIHOP_SYSTEM_PROMPT = "Search the town and word, follow the path to the goal, answer in \\boxed{}."
DATA_SOURCE = "multihop_paths"


@dataclasses.dataclass(frozen=True)
class PathQuestion:
    """One question: the town, its path of words (first = given, last = the goal)."""

    id: str
    question: str
    answer: str
    town: str
    path: tuple[str, ...]

    @property
    def steps(self) -> int:
        """Searches a correct solution makes: one per word on the path."""
        return len(self.path)


def path_document(town: str, path: tuple[str, ...], index: int, doc_id: str) -> dict[str, str]:
    """The corpus document of the `index`-th word of `town`'s path; the title line is "Town word"."""
    word = path[index]
    body = f"{word} is the goal." if index == len(path) - 1 else f"{word} leads to {path[index + 1]}."
    return {"id": doc_id, "contents": f"{town} {word}\n{body}"}


def path_question(town: str, path: tuple[str, ...], qid: str) -> PathQuestion:
    text = f"In {town}, start at {path[0]} and follow the path. Which word is the goal?"
    return PathQuestion(qid, text, path[-1], town, path)


@dataclasses.dataclass(frozen=True)
class MultihopEnv:
    """Corpus plus train and held-out questions, one per town; held-out towns are disjoint from train towns."""

    corpus: tuple[dict[str, str], ...]
    train: tuple[PathQuestion, ...]
    heldout: tuple[PathQuestion, ...]

    @property
    def towns(self) -> tuple:
        return ()  # no per-town facts: the scripts read the path from the question

    @staticmethod
    def script(question: PathQuestion, _facts: object, rng: np.random.Generator, flaw_prob: float) -> list[str]:
        """`facts_sft.build_sft_sequences`'s script hook: the scripted segments of one question."""
        return multihop_segments(question, rng, flaw_prob)

    def write(self, directory: str | Path) -> dict[str, Path]:
        """Write corpus.jsonl, train.jsonl and heldout.jsonl (the towns task's layouts)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        paths = {name: directory / f"{name}.jsonl" for name in ("corpus", "train", "heldout")}
        rows = {"corpus": list(self.corpus)}
        for split in ("train", "heldout"):
            rows[split] = [{"id": q.id, "question": q.question, "answers": [q.answer], "data_source": DATA_SOURCE,
                            "town": q.town, "path": list(q.path)} for q in getattr(self, split)]
        for name, path in paths.items():
            with open(path, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(row) + "\n" for row in rows[name])
        return paths


def build_multihop_env(seed: int, n_train: int, n_heldout: int, min_steps: int = 2, max_steps: int = 4,
                       max_syllables: int = 1) -> MultihopEnv:
    """`n_train + n_heldout` towns, each with a path of `min_steps..max_steps` distinct words and one question."""
    if not 2 <= min_steps <= max_steps <= len(PATH_WORDS):
        raise ValueError(f"need 2 <= min_steps <= max_steps <= {len(PATH_WORDS)}, got {min_steps}, {max_steps}")
    if n_train < 1 or n_heldout < 1:
        raise ValueError(f"n_train and n_heldout must be >= 1, got {n_train}, {n_heldout}")
    towns = [t.name for t in generate_towns(n_train + n_heldout, seed, max_syllables)]
    rng = np.random.default_rng(seed + 1)
    questions, corpus = [], []
    for i, town in enumerate(towns):
        length = int(rng.integers(min_steps, max_steps + 1))
        path = tuple(PATH_WORDS[j] for j in rng.choice(len(PATH_WORDS), size=length, replace=False))
        split, number = ("heldout", i) if i < n_heldout else ("train", i - n_heldout)
        questions.append(path_question(town, path, f"{split}-{number}"))
        corpus += [path_document(town, path, j, f"path-{i}-{j}") for j in range(length)]
    order = rng.permutation(len(corpus))
    return MultihopEnv(tuple(corpus[j] for j in order), tuple(questions[n_heldout:]), tuple(questions[:n_heldout]))


def multihop_segments(question: PathQuestion, rng: np.random.Generator, early_answer_prob: float = 0.0) -> list[str]:
    """A scripted solution as generated segments; every segment but the last ends in a search.

    It searches "Town word" for each word of the path and answers the goal;
    with probability `early_answer_prob` it answers after the first search
    with the word that result leads to (the flaw).
    """
    if not 0.0 <= early_answer_prob <= 1.0:
        raise ValueError(f"early_answer_prob must be in [0, 1], got {early_answer_prob}")
    town, path = question.town, question.path
    searches = [f"<search>{town} {path[0]}</search>"] + [f"\n<search>{town} {w}</search>" for w in path[1:]]
    if rng.random() < early_answer_prob:
        return [searches[0], f"\n<answer>\\boxed{{ {path[1]}}}</answer>"]
    return [*searches, f"\n<answer>\\boxed{{ {path[-1]}}}</answer>"]


@dataclasses.dataclass(frozen=True)
class MultihopTask:
    """A generated task on disk, in the shape the demo pipeline reads (`env.train`, `env.heldout`, paths)."""

    env: MultihopEnv
    corpus: Path
    train: Path
    heldout: Path
    early_answer_prob: float = 0.0

    @property
    def towns_by_name(self) -> dict:
        return {}  # the scripts read the path from the question itself

    def tokenizer_texts(self, system_prompt: str, seed: int, num_scripts: int = 300, max_syllables: int = 1,
                        max_result_chars: int = 400) -> list[str]:
        """Tokenizer training text: prompt, corpus, questions and scripted trajectories, town names masked."""
        rng = np.random.default_rng(seed)
        docs = {d["contents"].partition("\n")[0]: d for d in self.env.corpus}
        texts = [system_prompt, *(d["contents"] for d in self.env.corpus), *(q.question for q in self.env.train)]
        for q in self.env.train[:num_scripts]:
            pieces = []
            for segment in multihop_segments(q, rng, self.early_answer_prob):
                pieces.append(segment)
                found = re.search(r"<search>(.*)</search>$", segment)
                if found:
                    pieces.append(format_tool_result(format_passages([docs[found.group(1)]], max_result_chars)))
            texts.append("".join(pieces))
        return mask_names(texts, [q.town for q in self.env.train + self.env.heldout], seed + 7919, max_syllables)


def mask_names(texts: list[str], names: list[str], seed: int, max_syllables: int) -> list[str]:
    """Replace every occurrence of a name by a freshly invented one, so no name becomes one piece."""
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")\b")
    total = sum(len(pattern.findall(t)) for t in texts)
    fresh = iter(invent_names(total + 1, seed, max_syllables))
    return [pattern.sub(lambda _: next(fresh), t) for t in texts]


def write_multihop_task(directory: str | Path, *, seed: int, n_train: int, n_heldout: int, min_steps: int = 2,
                        max_steps: int = 4, max_syllables: int = 1, early_answer_prob: float = 0.0) -> MultihopTask:
    """Generate the environment (`build_multihop_env`) and write its JSONL files to `directory`."""
    env = build_multihop_env(seed, n_train, n_heldout, min_steps, max_steps, max_syllables)
    paths = env.write(directory)
    return MultihopTask(env, paths["corpus"], paths["train"], paths["heldout"], early_answer_prob)


def setup_multihop_files(cfg, directory: str | Path) -> tuple[MultihopTask, str, list[str]]:
    """The demo pipeline's task stage for `cfg.env.task == "multihop"`: (task, system prompt, tokenizer text)."""
    e = cfg.env
    seed = int(e.get("seed", cfg.seed))  # the task is pinned across launch.compare's seeds, as the towns task is
    task = write_multihop_task(directory, seed=seed, n_train=int(e.n_train), n_heldout=int(e.n_heldout),
                               min_steps=int(e.min_steps), max_steps=int(e.max_steps),
                               max_syllables=int(e.max_syllables), early_answer_prob=float(e.early_answer_prob))
    system_prompt = e.system_prompt or MULTIHOP_SYSTEM_PROMPT
    return task, system_prompt, task.tokenizer_texts(system_prompt, seed, max_syllables=int(e.max_syllables),
                                                     max_result_chars=int(cfg.rollout.max_result_chars))
