"""`reasonrl rm train` and `reasonrl data select` end to end on tiny-random (JSON out, files written)."""

import json

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
        assert main([*args, "--out", str(out), "--steps", "2", "--batch-pairs", "2", "--eval-pairs", "4"]) == 0
        summary = json.loads(capsys.readouterr().out)
        assert summary == json.loads((out / "summary.json").read_text())
        assert 0.0 <= summary["held_out_accuracy"] <= 1.0 and summary["held_out_pairs"] == 2
        assert (out / "model" / "config.json").exists()


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
