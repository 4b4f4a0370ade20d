"""The generated visual tasks: the same problems every time, disjoint splits, answers that match what the
image shows and that their verifiers accept, and a clear refusal from a text-only model."""

import pytest

from reasonrl.cli import main
from reasonrl.data.arithmetic import ArithmeticTask
from reasonrl.data.loaders import DataError, builtin_names, load_examples
from reasonrl.data.prompts import PromptEncoder
from reasonrl.data.visual_tasks import COLOURS, IMAGE_SIZE, PROBLEMS, SPLIT_SIZES
from reasonrl.reward.router import program_verifiers

TASKS = sorted(PROBLEMS)


@pytest.mark.parametrize("task", TASKS)
def test_a_visual_task_is_the_same_every_time_and_its_splits_have_their_sizes(task):
    assert task in builtin_names(verifiable_only=True)
    first, again = load_examples(task, "test"), load_examples(task, "test")
    assert len(first) == SPLIT_SIZES["test"] and len(load_examples(task, "train")) == SPLIT_SIZES["train"]
    assert [(e.id, e.question, e.answer) for e in first] == [(e.id, e.question, e.answer) for e in again]
    assert [e.images[0].tobytes() for e in first[:5]] == [e.images[0].tobytes() for e in again[:5]]
    assert all(len(e.images) == 1 and e.images[0].size == (IMAGE_SIZE, IMAGE_SIZE) for e in first)


def test_no_test_sum_is_trained_on():
    test_sums = {_sum_of(e) for e in load_examples("visual_arithmetic", "test")}
    train_sums = {_sum_of(e) for e in load_examples("visual_arithmetic", "train")}
    assert test_sums and train_sums and not test_sums & train_sums
    assert all(ArithmeticTask.is_eval_problem(a, "+", b) for a, b in test_sums)


def _sum_of(example):
    """The operands the image shows, read back from the answer's generator (the id's seed)."""
    import random

    rng = random.Random(example.id)
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    held_out = ":test:" in example.id
    while ArithmeticTask.is_eval_problem(a, "+", b) != held_out:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
    assert str(a + b) == example.answer
    return tuple(sorted((a, b)))


@pytest.mark.parametrize("task", ["visual_grounding", "visual_pointing"])
def test_the_reference_box_holds_the_named_shape(task):
    for example in load_examples(task, "test")[:50]:
        x1, y1, x2, y2 = map(int, example.answer.split(","))
        colour = next(c for c in COLOURS if f" {c} " in example.question)
        centre = example.images[0].getpixel(((x1 + x2) // 2, (y1 + y2) // 2))
        assert centre == COLOURS[colour], example.id  # the box's centre is the target's colour
        assert 0 <= x1 < x2 < IMAGE_SIZE and 0 <= y1 < y2 < IMAGE_SIZE


def test_every_point_of_the_pointing_region_is_on_the_named_shape():
    for example in load_examples("visual_pointing", "test")[:50]:
        x1, y1, x2, y2 = map(int, example.answer.split(","))
        colour = COLOURS[next(c for c in COLOURS if f" {c} " in example.question)]
        pixels = {example.images[0].getpixel((x, y)) for x in range(x1, x2 + 1) for y in range(y1, y2 + 1)}
        assert pixels == {colour}, example.id  # no background of a circle's or triangle's bounding box


def test_every_reference_answer_is_accepted_by_its_tasks_verifier():
    verifiers = program_verifiers()
    for task in TASKS:
        for example in load_examples(task, "test")[:20]:
            if example.task_type == "grounding":
                response = f"Answer: [{example.answer}]"
            elif example.task_type == "pointing":
                x1, y1, x2, y2 = map(int, example.answer.split(","))
                response = f"Answer: ({(x1 + x2) / 2}, {(y1 + y2) / 2})"
            else:
                response = f"Answer: {example.answer}"
            assert verifiers[example.task_type](response, example.answer).correct, (task, example.id)
    counts = {int(e.answer) for e in load_examples("visual_counting", "test")}
    assert counts == set(range(1, 7))


def test_a_text_model_refuses_a_prompt_with_images(tokenizer, capsys):
    example = load_examples("visual_counting", "test")[0]
    with pytest.raises(DataError, match=f"prompt {example.id} shows images"):
        PromptEncoder(tokenizer, "answer_line", 512)(example)
    assert main(["eval", "--model", "tiny-random", "--dataset", "visual_counting", "--limit", "2"]) == 1
    assert "a text-only model cannot see" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tokenizer():
    from reasonrl.models.load import load_tokenizer

    return load_tokenizer("tiny-random")
