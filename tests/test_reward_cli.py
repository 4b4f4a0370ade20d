"""`reasonrl rm train` and `reasonrl data select` end to end on tiny-random (JSON out, files written)."""

import json

import pytest

from reasonrl.cli import main


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def pairs_file(tmp_path):
    rows = [
        {"prompt": f"Say something kind about {w}.", "chosen": f"{w} is great!", "rejected": f"{w}? no."}
        for w in "abcdefghij"
    ]
    return write_jsonl(tmp_path / "pairs.jsonl", rows)


def test_rm_train_reports_held_out_accuracy_for_both_kinds(tmp_path, capsys):
    for kind in ("bt", "pairwise"):
        out = tmp_path / kind
        args = ["rm", "train", "--kind", kind, "--model", "tiny-random", "--data", str(pairs_file(tmp_path))]
        args += ["--out", str(out), "--steps", "2", "--batch-pairs", "2", "--eval-pairs", "4", "--progress"]
        assert main(args) == 0
        captured = capsys.readouterr()
        summary = json.loads(captured.out)  # stdout: the JSON alone; progress on stderr
        assert summary == json.loads((out / "summary.json").read_text())
        for stage in ("held-out before: 2/2 pairs", "training: 2/2 steps  loss ", "held-out after: 2/2 pairs"):
            assert f"rm train {stage}" in captured.err, kind
        assert 0.0 <= summary["held_out_accuracy"] <= 1.0 and summary["held_out_pairs"] == 2
        assert (out / "model" / "config.json").exists()
    # the Bradley-Terry model also in the Hugging Face reward-model format, scoring as it does here
    from transformers import AutoModelForSequenceClassification

    from reasonrl.reward.bt import RewardModel

    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path / "bt" / "hf", num_labels=1)
    assert classifier.config.num_labels == 1
    prompt = [{"role": "user", "content": "hi"}]
    ours, exported = RewardModel.load(tmp_path / "bt"), RewardModel.load(tmp_path / "bt" / "hf")
    assert exported.score([prompt], ["hello"]) == pytest.approx(ours.score([prompt], ["hello"]), abs=1e-5)


def test_rm_train_reads_only_the_first_max_response_tokens(tmp_path, capsys):
    # chosen and rejected differ only after their first 8 tokens: cut there, the model cannot tell them apart
    rows = [{"prompt": f"Q{i}", "chosen": f"{i:04d}same good", "rejected": f"{i:04d}same bad!"} for i in range(10)]
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    args = ["rm", "train", "--model", "tiny-random", "--data", str(data), "--out", str(tmp_path / "o"), "--steps", "3"]
    assert main([*args, "--batch-pairs", "4", "--lr", "1e-2", "--max-response-tokens", "9"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["max_response_tokens"] == 9 and summary["held_out_accuracy"] == 0.5  # ties count 1/2


def test_rm_train_on_malformed_data_is_a_clear_error(tmp_path, capsys):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"chosen": "x"}])
    assert main(["rm", "train", "--model", "tiny-random", "--data", str(bad), "--out", str(tmp_path / "o")]) == 1
    assert "bad.jsonl:1" in capsys.readouterr().err


def test_data_select_writes_the_base_plus_the_hardest_candidates(tmp_path, capsys):
    candidates = write_jsonl(
        tmp_path / "cand.jsonl", [{"question": f"What is {i}+{i}?", "answer": str(2 * i)} for i in range(6)]
    )
    base = write_jsonl(tmp_path / "base.jsonl", [{"question": "What is 1+2?", "answer": "3"}])
    out = tmp_path / "merged.jsonl"
    args = ["data", "select", "--candidates", str(candidates), "--base", str(base), "--out", str(out)]
    args += ["--fraction", "0.5", "--samples", "2", "--max-new-tokens", "4", "model.name_or_path=tiny-random"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert summary["selected"] == 3 and len(rows) == summary["written"] == 4
    assert rows[0]["question"] == "What is 1+2?" and all(r["task_type"] == "math" for r in rows)


def test_data_select_never_selects_a_prompt_it_could_not_sample(tmp_path, capsys):
    long_question = "What is 1+1? " + "Think very carefully. " * 40  # over rollout.max_prompt_tokens=120
    rows = [{"question": long_question, "answer": "2"}] + [
        {"question": f"What is {i}+{i}?", "answer": str(2 * i)} for i in range(3)
    ]
    candidates, out = write_jsonl(tmp_path / "cand.jsonl", rows), tmp_path / "selected.jsonl"
    args = ["data", "select", "--candidates", str(candidates), "--out", str(out), "--fraction", "1.0"]
    args += ["--samples", "1", "--max-new-tokens", "2"]
    args += ["model.name_or_path=tiny-random", "rollout.max_prompt_tokens=120"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["unscored"] == 1 and summary["selected"] == 3
    assert long_question not in out.read_text()


def test_data_bon_keeps_the_reward_models_favourite_as_an_open_reference(tmp_path, capsys):
    from reasonrl.reward.bt import RewardModel

    rm_dir = RewardModel.from_policy("tiny-random").save(tmp_path / "rm")
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"question": f"Tell me about {w}.", "answer": "-"} for w in "abc"])
    out = tmp_path / "bon.jsonl"
    args = ["data", "bon", "--prompts", str(prompts), "--reward-model", str(rm_dir), "--out", str(out)]
    assert main([*args, "--n", "2", "--max-new-tokens", "4", "model.name_or_path=tiny-random", "--progress"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and all(r["task_type"] == "open" for r in rows)
    captured = capsys.readouterr()
    assert json.loads(captured.out)["written"] == 3
    assert "data bon sampling and scoring: 3/3 prompts" in captured.err and " tok/s " in captured.err


def test_data_select_takes_the_readme_command_a_split_and_a_limit(tmp_path, capsys):
    out = tmp_path / "pre_ppo.jsonl"
    args = ["data", "select", "--candidates", "gsm8k", "--base", "math500", "--out", str(out), "--limit", "3"]
    args += [
        "--samples",
        "1",
        "--max-new-tokens",
        "2",
        "model.name_or_path=tiny-random",
        "rollout.max_prompt_tokens=2000",
        "train.microbatch_tokens=4096",
    ]
    assert main([*args, "--progress"]) == 0  # math500 has a test split only: auto takes it
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["candidates"] == 3 and summary["base"] == 500 and summary["selected"] == 1
    assert "data select scoring candidates: 3/3 prompts" in captured.err
    assert main([*args, "--split", "train"]) == 1
    assert "built-in dataset 'math500' has no 'train' split (it has test)" in capsys.readouterr().err


def test_data_bon_takes_the_rm_train_output_directory_and_refuses_others_before_sampling(tmp_path, capsys):
    from reasonrl.reward.bt import RewardModel

    RewardModel.from_policy("tiny-random").save(tmp_path / "rm-run" / "model")  # what `rm train --out rm-run` writes
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"question": "Tell me a story.", "answer": "-"}])
    args = ["data", "bon", "--prompts", str(prompts), "--out", str(tmp_path / "bon.jsonl"), "--n", "2"]
    args += ["--max-new-tokens", "2", "model.name_or_path=tiny-random"]
    assert main([*args, "--reward-model", str(tmp_path / "rm-run")]) == 0
    assert json.loads(capsys.readouterr().out)["written"] == 1
    assert main([*args, "--reward-model", str(tmp_path)]) == 1
    assert capsys.readouterr().err.startswith(f"reasonrl: error: {tmp_path} is not a saved value model")
