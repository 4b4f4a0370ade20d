"""The visual verifiers on tables of cases, a reason per row: IoU edges, malformed boxes, hedging, points
on the edge, and counting off by one (counting answers use the math verifier)."""

import pytest

from reasonrl.reward.math import MathVerifier
from reasonrl.reward.visual_verifiers import GroundingVerifier, PointingVerifier, box_iou, parse_reference_box

REFERENCE = "0,0,10,10"  # a 10 x 10 box at the origin
GROUNDING = [
    # (response, correct, IoU or None, why)
    ("Answer: [0, 0, 10, 10]", True, 1.0, "the exact box"),
    ("Answer: (0, 0, 10, 10)", True, 1.0, "parentheses are a box too"),
    ("Answer: [0, 0, 10, 5]", True, 0.5, "IoU exactly at the threshold counts"),
    ("Answer: [0, 0, 10, 4.9]", False, 0.49, "IoU just below the threshold"),
    ("Answer: [10, 0, 20, 10]", False, 0.0, "touching edges share no area"),
    ("Answer: [50, 50, 60, 60]", False, 0.0, "disjoint"),
    ("Answer: [-5, -5, 5, 5]", False, 25 / 175, "off the image on two sides: partial overlap only"),
    ("Answer: [0, 0, 100, 100]", False, 0.01, "a box over the whole image does not pay"),
    ("Answer: [1e2, 0, 1.1e2, 10]", False, 0.0, "exponent notation is read as numbers"),
    ("Answer: [10, 10, 0, 0]", False, None, "corners swapped: no area"),
    ("Answer: [5, 0, 5, 10]", False, None, "zero width"),
    ("Answer: [0, 0, 1e400, 10]", False, None, "an overflowing coordinate is not finite"),
    ("Answer: [a, b, c, d]", False, None, "not numbers"),
    ("Answer: [0, 0, 10]", False, None, "three numbers are not a box"),
    ("Answer: [0, 0, 10, 10] or [50, 50, 60, 60]", False, None, "hedging between boxes"),
    ("Answer: [0, 0, 10, 10], i.e. [0, 0, 10, 10]", True, 1.0, "the same box twice is one answer"),
    ("I first tried [50, 50, 60, 60].\nAnswer: [0, 0, 10, 10]", True, 1.0, "the answer line decides"),
    ("maybe [50, 50, 60, 60], finally [0, 0, 10, 10]", True, 1.0, "no answer line: the last box"),
    ("", False, None, "an empty response"),
    ("Answer: [0, 0, 10, 10]\nI am confident this answer is correct.", True, 1.0, "a remark after the answer line"),
]


@pytest.mark.parametrize(("response", "correct", "iou", "why"), GROUNDING, ids=[c[3] for c in GROUNDING])
def test_grounding_verifier(response, correct, iou, why):
    result = GroundingVerifier()(response, REFERENCE)
    assert result.correct is correct and result.score == float(correct), why
    if iou is None:
        assert "iou" not in result.info and result.info["reason"], why
    else:
        assert result.info["iou"] == pytest.approx(iou), why


ANSWERS = [
    # (verifier, reference, response, correct, why): pointing in REFERENCE's box, counting (the math verifier)
    (PointingVerifier, REFERENCE, "Answer: (5, 5)", True, "the centre"),
    (PointingVerifier, REFERENCE, "Answer: [5, 5]", True, "square brackets"),
    (PointingVerifier, REFERENCE, "Answer: (10, 0)", True, "a corner: edges are inside"),
    (PointingVerifier, REFERENCE, "Answer: (10.01, 5)", False, "just outside"),
    (PointingVerifier, REFERENCE, "Answer: (-1, 5)", False, "left of the box"),
    (PointingVerifier, REFERENCE, "Answer: (5, 5) or (50, 50)", False, "hedging between points"),
    (PointingVerifier, REFERENCE, "Answer: (nan, 5)", False, "not a number"),
    (PointingVerifier, REFERENCE, "Answer: 5, 5", False, "a point needs brackets"),
    (MathVerifier, "3", "Answer: 3", True, "the count"),
    (MathVerifier, "3", "Answer: 4", False, "one too many"),
    (MathVerifier, "3", "Answer: 2", False, "one too few"),
    (MathVerifier, "3", "Answer: 3 or 4", False, "hedging between counts"),
    (MathVerifier, "3", "There are three squares. Answer: three", False, "a word is not the number"),
]


@pytest.mark.parametrize(("verifier", "reference", "response", "correct", "why"), ANSWERS, ids=[c[4] for c in ANSWERS])
def test_pointing_and_counting_answers(verifier, reference, response, correct, why):
    result = verifier()(response, reference)
    assert result.correct is correct and result.score == float(correct), why


def test_box_iou_is_symmetric_and_one_only_for_the_same_box():
    a, b = (0.0, 0.0, 4.0, 4.0), (2.0, 2.0, 6.0, 6.0)
    assert box_iou(a, b) == box_iou(b, a) == pytest.approx(4 / 28)
    assert box_iou(a, a) == 1.0


@pytest.mark.parametrize("reference", ["1,2,3", "5,5,5,9", "x,y,z,w", "0,0,inf,3"])
def test_a_reference_that_is_not_a_box_is_the_rows_error(reference):
    with pytest.raises(ValueError, match="is not a box"):
        parse_reference_box(reference)
