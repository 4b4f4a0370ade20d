"""`reasonrl eval`: the unbiased pass@k estimator from n > k samples, and per-source breakdowns."""

import json

import pytest

from reasonrl.cli import main
from reasonrl.data.examples import Example
from reasonrl.jobs.eval_metrics import pass_at_k, per_source_metrics, sampled_metrics
from reasonrl.reward.verifier_protocol import RewardResult


def result(extracted, correct):
    return RewardResult(float(correct), correct, {"extracted": extracted})


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 2 / 5),  # 1 - C(3,1)/C(5,1)
        (5, 2, 2, 7 / 10),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (10, 1, 3, 3 / 10),  # 1 - C(9,3)/C(10,3) = 1 - 84/120
        (4, 3, 2, 1.0),  # fewer than k wrong samples: every draw of k holds a correct one
        (4, 0, 2, 0.0),
        (3, 1, 3, 1.0),  # k = n: any sample correct
    ],
)
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_refuses_impossible_counts():
    with pytest.raises(ValueError, match=r"1 <= k <= n \(got n=2, c=1, k=3\)"):
        pass_at_k(2, 1, 3)


def test_sampled_metrics_with_more_samples_than_k():
    problems = [
        [result("5", True), result("4", False), result("4", False), result("5", True)],  # c = 2 of 4
        [result("1", False), result("1", False), result("2", True), result("2", True)],  # c = 2 of 4
        [result("7", False)] * 4,  # c = 0
    ]
    metrics = sampled_metrics(problems, k=2)
    assert metrics["pass@k"] == pytest.approx((5 / 6 + 5 / 6 + 0) / 3)  # 1 - C(2,2)/C(4,2) = 5/6
    assert metrics["avg@k"] == pytest.approx((0.5 + 0.5 + 0) / 3)
    assert metrics["maj@k"] == pytest.approx(1 / 3)  # first two samples: tie -> earliest; 5 right, 1 wrong
    assert sampled_metrics(problems)["pass@k"] == pytest.approx(2 / 3)  # k = n: any sample correct


def test_per_source_breakdown():
    examples = [Example(f"{s}:{i}", "q", "1", data_source=s) for i, s in enumerate(["a", "b", "a"])]
    greedy = [result("1", True), result("2", False), result("2", False)]
    groups = [[result("1", True), result("2", False)], [result("2", False)] * 2, [result("1", True)] * 2]
    breakdown = per_source_metrics(examples, greedy, groups, k=1)
    assert breakdown == {
        "a": {"problems": 2, "greedy_pass@1": 0.5, "avg@k": 0.75, "maj@k": 1.0, "pass@k": 0.75},
        "b": {"problems": 1, "greedy_pass@1": 0.0, "avg@k": 0.0, "maj@k": 0.0, "pass@k": 0.0},
    }


def test_eval_command_reports_n_samples_and_each_source(tmp_path, capsys):
    data = tmp_path / "mixed.jsonl"
    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1), "data_source": "ab"[i % 2]} for i in range(3)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["eval", "--model", "tiny-random", "--dataset", str(data), "--max-new-tokens", "4"]
    assert main([*args, "--k", "2", "--n", "3", "--system-prompt", "Be brief."]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["k"] == 2 and report["samples"] == 3
    assert {s: v["problems"] for s, v in report["per_source"].items()} == {"a": 2, "b": 1}
    assert set(report["per_source"]["a"]) == {"problems", "greedy_pass@1", "avg@k", "maj@k", "pass@k"}
    assert main([*args, "--k", "4", "--n", "2"]) == 2
    assert "--n 2 samples cannot estimate pass@4; give --n >= --k" in capsys.readouterr().err
