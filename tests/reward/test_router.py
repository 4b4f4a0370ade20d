"""The hybrid reward router: one source per task type, verifiable tasks never reach a judge, one scale."""

import pytest

from reasonrl.config.routes import DEFAULT_ROUTES, RoutingError, resolve_routes
from reasonrl.data.examples import Example
from reasonrl.reward.router import RewardRouter, route
from tests.helpers import DigitFraction


class FixedJudge:
    """A GenRM stand-in that records what it was asked."""

    def __init__(self):
        self.calls = []

    def score(self, questions, responses, references):
        self.calls.append(list(zip(questions, responses, references, strict=True)))
        return [0.8 if r == ref else 0.2 for r, ref in zip(responses, references, strict=True)]


class FixedRewardModel:
    def score(self, prompts, responses):
        return [0.0 for _ in responses]


def examples():
    return [
        Example("m1", "1+1?", "2", "math"),
        Example("c1", "write f", "tests", "code"),
        Example("r1", "capital?", "Paris", "reference"),
        Example("o1", "a poem", "best-of-n poem", "open"),
        Example("p1", "be kind", "", "preference"),
        Example("m2", "2+2?", "4", "math"),
    ]


def test_every_task_type_routes_to_exactly_one_source_and_verifiable_tasks_to_verifiers():
    routes = resolve_routes()
    for task_type in DEFAULT_ROUTES:
        assert route(task_type, routes) == DEFAULT_ROUTES[task_type]
    assert route("math", routes) == "math" and route("code", routes) == "code"
    with pytest.raises(RoutingError, match="verifiable task must be scored by a verifier"):
        resolve_routes(["math=genrm_reference"])
    with pytest.raises(RoutingError, match="no reward source for task_type 'poetry'"):
        route("poetry", routes)
    assert resolve_routes(["open=bt"])["open"] == "bt"


def test_the_router_scores_each_sample_from_its_source_on_one_scale():
    judge = FixedJudge()
    router = RewardRouter(
        resolve_routes(),
        {"math": DigitFraction(), "code": DigitFraction()},
        {"genrm_reference": lambda: judge, "genrm_bon": lambda: judge, "bt": FixedRewardModel},
        workers=1,
    )
    try:
        responses = ["22", "x", "Paris", "roses", "kind words", "ab"]
        results = router.score_examples(examples(), responses)
    finally:
        router.close()
    sources = [r.info["source"] for r in results]
    assert sources == ["math", "code", "genrm_reference", "genrm_bon", "bt", "math"]
    scores = [r.score for r in results]
    assert scores == pytest.approx([1.0, 0.0, 0.8, 0.2, 0.5, 0.0])  # bt: σ(0) = 0.5
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert [r.correct for r in results] == [True, False, True, False, False, False]
    asked = [item for call in judge.calls for item in call]
    assert {q for q, _, _ in asked} == {"capital?", "a poem"}  # no math or code prompt reached the judge
    assert ("a poem", "roses", "best-of-n poem") in asked


def test_a_model_source_without_a_model_is_a_clear_error():
    router = RewardRouter(resolve_routes(), {"math": DigitFraction()}, {}, workers=1)
    with pytest.raises(RoutingError, match="needs a model"):
        router.score_examples([Example("r", "q", "a", "reference")], ["a"])


def test_a_judged_row_with_a_ground_truth_is_also_checked_by_the_verifier_but_rewarded_by_the_judge():
    from reasonrl.reward.math import MathVerifier
    from reasonrl.training.rollouts.rollout_stats import source_stats

    judge = FixedJudge()  # 0.8 when the response equals the reference, else 0.2
    router = RewardRouter(resolve_routes(), {"math": MathVerifier()}, {"genrm_bon": lambda: judge}, workers=1)
    rows = [  # the judge sees a best-of-N reference; the truth is in the row's verifier_answer column
        Example("o1", "3+4?", "Answer: 8", "open", fields={"verifier_answer": "7"}),
        Example("o2", "2+2?", "Answer: 4", "open", fields={"verifier_answer": "4"}),
        Example("o3", "a poem", "roses", "open"),
    ]
    try:
        results = router.score_examples(rows, ["Answer: 8", "Answer: 5", "violets"])
    finally:
        router.close()
    assert [r.score for r in results] == pytest.approx([0.8, 0.2, 0.2])  # the judge's reward, hacked on o1
    assert [r.info.get("verifier_correct") for r in results] == [False, False, None]
    stats = source_stats(results)
    assert stats["reward/verifier_accuracy"] == 0.0
    assert stats["reward/judge_minus_verifier"] == pytest.approx(0.5)  # (0.8 + 0.2) / 2 − 0
    assert stats["reward/judge_fooled"] == 0.5  # o1: the judge says right, the verifier wrong


def test_the_bradley_terry_source_reads_an_hh_dialogue_as_the_chat_it_was_trained_on():
    from reasonrl.data.preferences import hh_prompt_example

    seen = []

    class RecordingRewardModel:
        def score(self, prompts, responses):
            seen.extend(prompts)
            return [0.0 for _ in responses]

    row = {"chosen": "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: how do I bake bread?\n\nAssistant: Knead it."}
    example = hh_prompt_example("test", "hh.jsonl", row, 0)
    assert example.answer == "Knead it." and "how do I bake bread?" in example.question  # judges read text
    router = RewardRouter(resolve_routes(["reference=bt"]), {}, {"bt": RecordingRewardModel}, workers=1)
    try:
        router.score_examples([example], ["Use flour."])
    finally:
        router.close()
    assert seen == [
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "how do I bake bread?"},
        ]
    ]
