"""Generated visual tasks (the verifiable visual RL of Seed1.5-VL, arXiv 2505.07062, §5), seeded like the
arithmetic task: each problem is an image rendered with PIL and a question whose answer a program checks.

- ``visual_arithmetic``: a two-digit sum written in the image ("47+38", one character per 16-pixel cell of
  a grid, as on a terminal's screen); the number (math verifier).
- ``visual_counting``: 1–6 shapes of one kind among others ("How many red squares ..."); the count (math).
- ``visual_grounding``: one target shape among distractors; its box [x1, y1, x2, y2] in pixels (the
  ``grounding`` verifier: IoU ≥ 0.5).
- ``visual_pointing``: the same scenes; a point (x, y) on the target (the ``pointing`` verifier, against
  the largest box inside the shape: a point on the background of a circle's bounding box is not on it).

Each problem also carries what ``reasonrl vlm build`` aligns a vision encoder with a language model on: a
caption of its image (``fields["caption"]``: every shape and its box, or the sum written) and the word each
``CELL``-pixel cell of the image holds (``fields["cells"]``, row by row: the character written there, the
colour of the shape whose centre lies there, or "" for an empty cell).

Images are ``IMAGE_SIZE`` pixels square, white, the origin at the top left.  Every problem is drawn from
its own seeded generator ("visual_counting:test:17"), so the splits are the same on every machine and
a problem can be rendered again from its id; train and test draw from different seeds, and the sums keep
the arithmetic task's split (no test sum is trained on).  The scenes' unused ``held_out`` argument keeps
one signature: their positions and sizes are continuous enough that two splits do not share a scene.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from reasonrl.data.arithmetic import ArithmeticTask
from reasonrl.data.examples import Example

if TYPE_CHECKING:
    from PIL.Image import Image

IMAGE_SIZE = 96
CELL = 16  # the grid of ``fields["cells"]``: a vision encoder's 16-pixel patches
GRID = IMAGE_SIZE // CELL
SPLIT_SIZES = {"train": 2000, "test": 200}
COLOURS = {"red": (220, 30, 30), "green": (30, 160, 60), "blue": (40, 70, 220), "yellow": (230, 190, 20)}
SHAPES = ("square", "circle", "triangle")
BOX_INSTRUCTION = (
    f"The image is {IMAGE_SIZE} x {IMAGE_SIZE} pixels with the origin at the top left. Give the final answer "
    "on the last line as 'Answer: [x1, y1, x2, y2]', the corners of the box in pixels."
)
POINT_INSTRUCTION = (
    f"The image is {IMAGE_SIZE} x {IMAGE_SIZE} pixels with the origin at the top left. Give the final answer "
    "on the last line as 'Answer: (x, y)', a point in pixels."
)

Box = tuple[int, int, int, int]


def _canvas() -> tuple[Image, object]:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), "white")
    return image, ImageDraw.Draw(image)


def _draw_shape(draw, shape: str, colour: str, box: Box) -> None:
    x1, y1, x2, y2 = box
    fill = COLOURS[colour]
    if shape == "square":
        draw.rectangle(box, fill=fill)
    elif shape == "circle":
        draw.ellipse(box, fill=fill)
    else:
        draw.polygon([((x1 + x2) / 2, y1), (x2, y2), (x1, y2)], fill=fill)


def _place(rng: random.Random, taken: list[Box], size: int) -> Box:
    """A ``size`` box inside the image, at least 2 pixels from every box in ``taken``."""
    for _ in range(1000):
        x, y = rng.randint(1, IMAGE_SIZE - size - 2), rng.randint(1, IMAGE_SIZE - size - 2)
        box = (x, y, x + size, y + size)
        if all(box[2] + 2 < t[0] or t[2] + 2 < box[0] or box[3] + 2 < t[1] or t[3] + 2 < box[1] for t in taken):
            return box
    raise RuntimeError("no room left for another shape")  # not reached at these sizes and counts


def _scene(rng: random.Random, targets: int, distractors: int) -> tuple[Image, str, str, list[Box], dict]:
    """An image with ``targets`` shapes of one (colour, shape) and ``distractors`` shapes of any other
    kind: (image, colour, shape, the targets' boxes, its fields: a caption naming every shape and its box,
    the cells' words)."""
    colour, shape = rng.choice(sorted(COLOURS)), rng.choice(SHAPES)
    others = [(c, s) for c in COLOURS for s in SHAPES if (c, s) != (colour, shape)]
    image, draw = _canvas()
    taken: list[Box] = []
    kinds = [(colour, shape)] * targets + [rng.choice(others) for _ in range(distractors)]
    rng.shuffle(kinds)
    boxes, drawn = [], []
    for kind in kinds:
        box = _place(rng, taken, rng.randint(10, 18))
        taken.append(box)
        _draw_shape(draw, kind[1], kind[0], box)
        drawn.append((box[1], box[0], f"a {kind[0]} {kind[1]} at [{', '.join(map(str, box))}]"))
        if kind == (colour, shape):
            boxes.append(box)
    caption = "The image shows " + ", ".join(text for _, _, text in sorted(drawn)) + "."  # top to bottom
    cells = [""] * GRID**2
    for kind, box in zip(kinds, taken, strict=True):  # the colour of the shape centred in a cell
        cells[(box[1] + box[3]) // 2 // CELL * GRID + (box[0] + box[2]) // 2 // CELL] = kind[0]
    return image, colour, shape, boxes, {"caption": caption, "cells": cells}


def arithmetic_problem(rng: random.Random, problem_id: str, held_out: bool) -> Example:
    """A sum of the arithmetic task's split (no test sum, nor its commuted twin, is ever trained on), written
    one character per cell at a random row and column."""
    from PIL import ImageFont

    a, b = rng.randint(10, 99), rng.randint(10, 99)
    while ArithmeticTask.is_eval_problem(a, "+", b) != held_out:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
    image, draw = _canvas()
    font = ImageFont.load_default(size=CELL - 1)
    text = f"{a}+{b}"
    row, column = rng.randint(0, GRID - 1), rng.randint(0, GRID - len(text))
    cells = [""] * GRID**2
    for k, character in enumerate(text):
        left, top, right, bottom = draw.textbbox((0, 0), character, font=font)
        x = (column + k) * CELL + (CELL - (right - left)) // 2 - left  # centred in its cell
        y = row * CELL + (CELL - (bottom - top)) // 2 - top
        draw.text((x, y), character, fill="black", font=font)
        cells[row * GRID + column + k] = character
    question = "What is the value of the sum written in the image?"
    fields = {"caption": f"The image shows the sum {text} written in black.", "cells": cells}
    return Example(problem_id, question, str(a + b), data_source="visual_arithmetic", fields=fields, images=(image,))


def counting_problem(rng: random.Random, problem_id: str, held_out: bool) -> Example:
    count = rng.randint(1, 6)
    image, colour, shape, _, fields = _scene(rng, count, rng.randint(0, 3))
    question = f"How many {colour} {shape}s are in the image?"
    return Example(problem_id, question, str(count), data_source="visual_counting", fields=fields, images=(image,))


def grounding_problem(rng: random.Random, problem_id: str, held_out: bool) -> Example:
    image, colour, shape, (box,), fields = _scene(rng, 1, rng.randint(1, 3))
    question = f"Where is the {colour} {shape} in the image? {BOX_INSTRUCTION}"
    answer = ",".join(map(str, box))
    return Example(problem_id, question, answer, "grounding", (), "visual_grounding", fields, (image,))


def inner_box(shape: str, box: Box) -> Box:
    """The largest box, 1 pixel in from the edges, that holds only the shape's pixels: a point in it is on
    the shape (a circle's or triangle's bounding box also holds background)."""
    x1, y1, x2, y2 = box
    if shape == "circle":
        half = int((x2 - x1) / 2 / 2**0.5)  # the inscribed square
        cx, cy = (x1 + x2) // 2, (y1 + y2) // 2
        x1, y1, x2, y2 = cx - half, cy - half, cx + half, cy + half
    elif shape == "triangle":  # apex at the top centre: below half height the triangle spans half the width
        width = x2 - x1
        x1, y1, x2 = x1 + width // 4, (y1 + y2) // 2, x2 - width // 4
    return x1 + 1, y1 + 1, x2 - 1, y2 - 1


def pointing_problem(rng: random.Random, problem_id: str, held_out: bool) -> Example:
    image, colour, shape, (box,), fields = _scene(rng, 1, rng.randint(1, 3))
    question = f"Point at the {colour} {shape} in the image. {POINT_INSTRUCTION}"
    answer = ",".join(map(str, inner_box(shape, box)))
    return Example(problem_id, question, answer, "pointing", (), "visual_pointing", fields, (image,))


PROBLEMS: dict[str, Callable[[random.Random, str, bool], Example]] = {
    "visual_arithmetic": arithmetic_problem,
    "visual_counting": counting_problem,
    "visual_grounding": grounding_problem,
    "visual_pointing": pointing_problem,
}


def visual_examples(task: str, split: str) -> list[Example]:
    """The ``train`` (2000) or ``test`` (200) problems of one visual task, the same every time."""
    make = PROBLEMS[task]
    held_out = split == "test"
    return [
        make(random.Random(f"{task}:{split}:{i}"), f"{task}:{split}:{i}", held_out) for i in range(SPLIT_SIZES[split])
    ]
