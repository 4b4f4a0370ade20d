"""Custom reward functions (TRL's and verl's shapes): weights, arguments, failures, bad names."""

import pytest

from reasonrl.config import ConfigError, load_config
from reasonrl.data.examples import Example
from reasonrl.reward.custom import RewardFunctionError, WeightedRewards, reward_terms
from reasonrl.reward.verifier_protocol import RewardResult

FUNCTIONS = "tests.reward_functions"


class EndsWithAnswer:
    """An in-process stand-in for the built-in scorer: correct when the response ends with the answer."""

    closed = False

    def score_examples(self, examples, responses, context=None):
        return [
            RewardResult(float(r.endswith(e.answer)), r.endswith(e.answer), {"extracted": r[-1:], "source": "math"})
            for e, r in zip(examples, responses, strict=True)
        ]

    def close(self):
        self.closed = True


def example(answer="7", source="a", **fields):
    return Example(f"{source}:{answer}", "What is 3 + 4?", answer, data_source=source, fields=fields)


def scorer(functions, weights=(), timeout=20.0):
    return WeightedRewards(reward_terms(functions, weights), EndsWithAnswer(), workers=1, timeout=timeout)


def test_functions_combine_by_weight_with_the_verifier_as_one_term():
    rewards = scorer(["verifier", f"{FUNCTIONS}:digit_share", f"{FUNCTIONS}:compute_score"], [1.0, 0.5, 2.0])
    try:
        right, wrong = rewards.score_examples([example(), example(extra_info={"bonus": True})], ["ab 7", "1234"])
    finally:
        rewards.close()
    # verifier 1, digit share 1/4, verl 1  ->  1 + 0.5 * 0.25 + 2 * 1
    assert right.score == pytest.approx(3.125) and right.correct
    assert right.info["terms"] == {"verifier": 1.0, "digit_share": 0.25, "compute_score": 1.0}
    assert right.info["extracted"] == "7" and right.info["source"] == "custom"
    # verifier 0, digit share 1, verl 0 + 0.5 bonus (extra_info) -> 0.5 + 1.0; the verdict is the verifier's
    assert wrong.score == pytest.approx(1.5) and not wrong.correct
    assert rewards.builtin.closed


def test_custom_functions_alone_none_is_left_out_and_the_verdict_comes_from_the_first_term_with_one():
    rewards = scorer([f"{FUNCTIONS}:only_source_a", f"{FUNCTIONS}:digit_share"])
    try:
        a, b = rewards.score_examples([example(source="a"), example(source="b")], ["x", "77"])
    finally:
        rewards.close()
    assert a.score == 1.0 and a.correct  # 1 + 0 > 0.5: no term gives a verdict
    assert b.info["terms"] == {"only_source_a": None, "digit_share": 1.0} and b.score == 1.0
    verl = scorer([f"{FUNCTIONS}:compute_score"])
    try:
        (result,) = verl.score_examples([example(answer="9")], ["it is 8"])
    finally:
        verl.close()
    assert result.score == 0.0 and not result.correct and result.info["terms"] == {"compute_score": 0.0}


def test_trl_functions_get_the_prompt_completion_and_row_fields_as_trl_passes_them():
    row = Example(
        "src:0",
        "What is 3 + 4?",
        "7",
        messages=({"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 3 + 4?"}),
        data_source="src",
        fields={"extra_info": {"index": 3}, "ability": "math"},
    )
    rewards = scorer([f"{FUNCTIONS}:check_arguments"])
    try:
        (result,) = rewards.score_examples([row], ["It is 7"])
    finally:
        rewards.close()
    assert "error" not in result.info, result.info.get("error")
    assert result.score == 1.0


def test_a_function_that_raises_hangs_or_returns_the_wrong_shape_costs_its_call_not_the_run(caplog):
    """A TRL-shaped function is called once per batch, as TRL calls it: when that call raises, hangs or returns
    the wrong shape, its term is missing from the batch's samples (an error each, counted), the other terms keep
    their values, and the next batch is scored afresh."""
    functions = [f"{FUNCTIONS}:raises_on_boom", f"{FUNCTIONS}:hangs_on_hang", f"{FUNCTIONS}:returns_a_float"]
    rewards = scorer(["verifier", *functions], timeout=1.0)
    try:
        fine = rewards.score_examples([example()] * 2, ["7", "ok 7"])
        boom, also = rewards.score_examples([example()] * 2, ["boom 7", "7"])
        (hang,) = rewards.score_examples([example()], ["hang 7"])
    finally:
        rewards.close()
    every = {"verifier": 1.0, "raises_on_boom": 1.0, "hangs_on_hang": 1.0, "returns_a_float": 0.0}
    for ok in fine:
        assert ok.info["terms"] == every
        assert list(ok.info["term_errors"]) == ["returns_a_float"]
    assert "returns_a_float: TypeError: returned 1.0; a TRL-style reward function returns a list" in ok.info["error"]
    for failed in (boom, also):  # the call that saw "boom" raised: both of its samples lose that term
        assert failed.score == 2.0 and list(failed.info["term_errors"]) == ["raises_on_boom", "returns_a_float"]
        assert "raises_on_boom: ValueError: cannot score a boom" in failed.info["error"]
    assert hang.score == 2.0 and "hangs_on_hang: timeout after 1s" in hang.info["error"]
    logged = caplog.text
    assert "reward function 'raises_on_boom' failed on response 0 " in logged
    assert 'reward_functions.py", line 35, in raises_on_boom\n    raise ValueError("cannot score a boom")' in logged
    assert "reward function 'hangs_on_hang' failed on response 0 " in logged and "timed out after 1s" in logged


def test_a_trl_function_gets_the_whole_batch_its_token_ids_and_the_trainer_state():
    """TRL calls a reward function once with every completion of the batch (a reward that normalises over its
    batch keeps its meaning), with ``completion_ids`` and ``trainer_state``."""
    from reasonrl.reward.verifier_protocol import ScoringContext

    rewards = scorer([f"{FUNCTIONS}:batch_rank"])
    context = ScoringContext(completion_ids=((5, 6), (7,), (8, 9, 10)), step=3, max_steps=10)
    try:
        results = rewards.score_examples([example()] * 3, ["bb", "a", "ccc"], context)
    finally:
        rewards.close()
    assert [r.info["terms"]["batch_rank"] for r in results] == [0.5, 0.0, 1.0]  # ranks within the batch of 3


def test_a_file_path_function(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text("def shout(prompts, completions, **kw):\n    return [float(c.isupper()) for c in completions]\n")
    rewards = scorer([f"{path}:shout"])
    try:
        loud, quiet = rewards.score_examples([example(), example()], ["YES", "no"])
    finally:
        rewards.close()
    assert (loud.score, quiet.score) == (1.0, 0.0)


@pytest.mark.parametrize(
    ("functions", "weights", "message"),
    [
        (["score"], (), "reward.functions entry 'score' is not 'module:function' or 'path/to/file.py:function'"),
        (["no_such_module_x:score"], (), "cannot import 'no_such_module_x' (ModuleNotFoundError"),
        ([f"{FUNCTIONS}:missing"], (), "'tests.reward_functions' has no 'missing'"),
        (["/nowhere/rewards.py:score"], (), "reward function file /nowhere/rewards.py does not exist"),
        ([f"{FUNCTIONS}:digit_share"], (1.0, 2.0), "reward.weights has 2 entries for 1 reward.functions"),
        ([f"{FUNCTIONS}:digit_share", f"{FUNCTIONS}:digit_share"], (), "names digit_share more than once"),
    ],
)
def test_bad_function_names_fail_with_a_clear_message(functions, weights, message):
    with pytest.raises(RewardFunctionError) as caught:
        reward_terms(functions, weights)
    assert message in str(caught.value)


def test_the_config_checks_entries_and_weights_before_anything_loads():
    with pytest.raises(ConfigError) as caught:
        load_config("grpo", ["reward.functions=[score, 'a.b:c']", "reward.weights=[1.0]"])
    assert "reward.weights has 1 entries for 2 reward.functions" in str(caught.value)
    assert "reward.functions entry 'score' is not 'module:function'" in str(caught.value)
    cfg = load_config("grpo", ["reward.functions=[verifier, 'pkg.mod:fn']", "reward.weights=[1, 0.2]"])
    assert cfg.reward.functions == ("verifier", "pkg.mod:fn") and cfg.reward.weights == (1.0, 0.2)


def test_a_reward_the_float32_batch_cannot_hold_fails_that_sample_only():
    """1e39 is a finite Python float but inf in the batch, where it would turn every advantage NaN: refused as
    a non-finite reward is, for its sample only; so is a weight that takes a sum past float32's range."""
    rewards = scorer(["verifier", f"{FUNCTIONS}:overflows_on_huge"], [1.0, 1.0])
    weighted = scorer(["verifier", f"{FUNCTIONS}:overflows_on_huge"], [1.0, 1e30])
    try:
        fine, huge = rewards.score_examples([example()] * 2, ["7", "huge 7"])
        (past,) = weighted.score_examples([example()], ["7"])
    finally:
        rewards.close()
        weighted.close()
    assert fine.score == 1 + 1e10 and "error" not in fine.info
    assert huge.score == 1.0 and list(huge.info["term_errors"]) == ["overflows_on_huge"]
    assert "returned 1e+39; a reward is a finite number within float32's range" in huge.info["error"]
    assert past.score == 1.0 and "takes the sum past float32" in past.info["term_errors"]["overflows_on_huge"]


@pytest.mark.parametrize("value", [1e39, -1e39, float("inf"), float("nan"), True, "1.0", None])
def test_reward_number_takes_only_what_float32_holds(value):
    from reasonrl.reward.verifier_protocol import reward_number

    with pytest.raises(TypeError, match="a reward is a finite number"):
        reward_number(value)


def test_reward_number_keeps_what_float32_holds():
    from reasonrl.reward.verifier_protocol import reward_number

    assert reward_number(3.4e38) == 3.4e38 and reward_number(-2) == -2.0 and reward_number(0.25) == 0.25
