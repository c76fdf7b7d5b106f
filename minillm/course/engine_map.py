"""The engine's map: one diagram of a request's path through minillm, drawn at the top of every chapter
with the parts that chapter builds marked (`minillm course sync` writes it; tests/course/test_book.py
checks every chapter carries its own). Only the standard library, like release.py."""

from __future__ import annotations

# The map cell starts with this line, so that sync finds the cell to rewrite.
MAP_HEADING = "**Where this chapter sits in the engine**"

# A request's path, in order: (part, what it does, where it lives, the chapters that build it).
PARTS: tuple[tuple[str, str, str, tuple[int, ...]], ...] = (
    ("scheduler", "who runs this step, with how many tokens", "engine/scheduler.py", (4, 9)),
    ("KV-cache manager", "each sequence's blocks, the prefix cache", "kv/", (1, 2, 9)),
    ("model runner", "the step's inputs, CUDA graphs", "engine/model_runner.py", (8,)),
    ("model", "embeddings, decoder layers, logits", "models/, layers/", (0, 6, 9)),
    ("kernels", "attention, quantized and fused ops", "kernels/, attention/", (3, 6, 8, 9)),
    ("sampler", "next tokens; drafts verified", "sample/, spec_decode/", (0, 5, 9)),
    ("output processor", "text, stops, metrics", "engine/output_processor.py", (4, 7)),
)
SERVER = ("server", "OpenAI-compatible HTTP around it all", "entrypoints/", (7,))
MARK = "◀ this chapter"


def engine_map(chapter: int) -> str:
    """The map cell of a chapter (its number, 0 to 9): the diagram with its parts marked, and a link to
    the glossary."""
    name_width = max(len(part[0]) for part in (*PARTS, SERVER))
    text_width = max(len(part[1]) for part in (*PARTS, SERVER))
    where_width = max(len(part[2]) for part in (*PARTS, SERVER))

    def line(prefix: str, part: tuple[str, str, str, tuple[int, ...]]) -> str:
        name, what, where, chapters = part
        mark = f"  {MARK}" if chapter in chapters else ""
        return f"{prefix}{name:<{name_width}}  {what:<{text_width}}  {where:<{where_width}}{mark}".rstrip()

    rows = [line("┌─── ", SERVER), "│ request", *(line("│  → ", part) for part in PARTS), "│ response"]
    return "\n".join([MAP_HEADING, "", "```text", *rows, "```", "",
                      "The words the course uses are defined in its [glossary](GLOSSARY.md)."])
