"""Verifiers of visual grounding (Seed1.5-VL, arXiv 2505.07062, §5: RL with verifiable visual rewards).

``grounding``: the response names a box [x1, y1, x2, y2] (pixels, corners top-left and bottom-right); it is
right when its IoU with the reference box reaches the threshold (0.5, the usual detection criterion).
``pointing``: the response names a point (x, y); it is right when the point lies in the reference box,
edges included.  Counting and arithmetic shown in an image have numeric answers and use the math verifier.

The answer is read like a math answer: from the last "Answer: ..." line when there is one, else from the
whole response, and the last box (or point) there counts.  A final answer that names several different
boxes or points is not rewarded (hedging must not pay), and so are boxes with no area, coordinates that are
not finite numbers, and a reference that is not a box (the row's fault: it names the row's text).
"""

from __future__ import annotations

import math
import re

from reasonrl.reward.math import answer_lines
from reasonrl.reward.verifier_protocol import RewardResult

NUMBER_TEXT = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
NUMBER = rf"\s*({NUMBER_TEXT})\s*"
BOX = re.compile(r"[\[(]" + ",".join([NUMBER] * 4) + r"[\])]")
POINT = re.compile(r"[\[(]" + ",".join([NUMBER] * 2) + r"[\])]")
IOU_THRESHOLD = 0.5

Box = tuple[float, float, float, float]


def parse_reference_box(reference: str) -> Box:
    """A reference box "x1,y1,x2,y2" (brackets optional); ValueError when it is not a box with area."""
    numbers = [float(v) for v in re.findall(NUMBER_TEXT, reference)]
    if len(numbers) != 4 or not all(map(math.isfinite, numbers)):
        raise ValueError(f"reference {reference!r} is not a box x1,y1,x2,y2")
    x1, y1, x2, y2 = numbers
    if x2 <= x1 or y2 <= y1:
        raise ValueError(f"reference {reference!r} is not a box with x1 < x2 and y1 < y2")
    return x1, y1, x2, y2


def box_iou(a: Box, b: Box) -> float:
    """Intersection over union of two boxes (x1, y1, x2, y2) with positive area; in [0, 1]."""
    width = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    height = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    intersection = width * height
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - intersection
    return intersection / union


def final_answer_text(response: str) -> str:
    """The text the answer is read from: the last "Answer: ..." line, else the whole response."""
    lines = answer_lines(response)
    return lines[-1] if lines else response


def _final_tuple(response: str, pattern: re.Pattern) -> tuple[tuple[float, ...] | None, str]:
    """(the last tuple ``pattern`` finds in the final answer, or None; why not)."""
    text = final_answer_text(response)
    found = [tuple(float(v) for v in m.groups()) for m in pattern.finditer(text)]
    if not found:
        return None, "no answer found"
    if text is not response and len(set(found)) > 1:
        return None, "several different answers"
    if not all(map(math.isfinite, found[-1])):
        return None, "coordinates are not finite numbers"
    return found[-1], ""


class GroundingVerifier:
    """Correct when the answered box overlaps the reference box with IoU ≥ ``threshold``; score 1.0 or 0.0,
    the IoU in ``info``."""

    def __init__(self, threshold: float = IOU_THRESHOLD) -> None:
        self.threshold = threshold

    def __call__(self, response: str, reference: str) -> RewardResult:
        target = parse_reference_box(reference)
        box, why = _final_tuple(response, BOX)
        if box is None:
            return RewardResult(0.0, False, {"extracted": None, "reason": why})
        x1, y1, x2, y2 = box
        if x2 <= x1 or y2 <= y1:
            return RewardResult(0.0, False, {"extracted": list(box), "reason": "the box has no area"})
        iou = box_iou((x1, y1, x2, y2), target)
        correct = iou >= self.threshold
        return RewardResult(float(correct), correct, {"extracted": list(box), "iou": iou})


class PointingVerifier:
    """Correct when the answered point (x, y) lies inside the reference box, edges included."""

    def __call__(self, response: str, reference: str) -> RewardResult:
        x1, y1, x2, y2 = parse_reference_box(reference)
        point, why = _final_tuple(response, POINT)
        if point is None:
            return RewardResult(0.0, False, {"extracted": None, "reason": why})
        x, y = point
        correct = x1 <= x <= x2 and y1 <= y <= y2
        return RewardResult(float(correct), correct, {"extracted": list(point)})
