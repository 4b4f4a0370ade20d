"""Sharing a run: checkpoints load with from_pretrained; `reasonrl push` uploads the model and a model card."""

import json
import os
import shutil
import typing

import pytest
import torch

from reasonrl.cli import main
from tests.train.test_loop import TINY


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    overrides = [*TINY, "train.rollout_steps=2", "run.save_every=1", f"run.output_dir={root}", "run.name=tiny"]
    overrides += ["train.lr=1e-3", "reward.functions=['tests.reward_functions:digit_share']"]  # rewards that vary
    assert main(["train", "grpo", *overrides, "--quiet"]) == 0
    return root / "tiny"


def test_an_intermediate_checkpoint_loads_with_from_pretrained(run_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    checkpoint = run_dir / "checkpoints" / "step-000001"
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    final = AutoModelForCausalLM.from_pretrained(run_dir / "final")
    ids = torch.tensor([tokenizer("What is 2 + 2?")["input_ids"]])
    assert tokenizer.chat_template and model.config.num_hidden_layers == 2
    with torch.no_grad():
        assert not torch.equal(model(ids).logits, final(ids).logits)  # step 1's weights, not the final ones
    last = AutoModelForCausalLM.from_pretrained(run_dir / "checkpoints" / "step-000002")
    for name, tensor in final.state_dict().items():
        assert torch.equal(tensor, last.state_dict()[name]), name  # the last checkpoint is the final model


class FakeApi:
    calls: typing.ClassVar[list] = []

    def create_repo(self, repo_id, **kwargs):
        FakeApi.calls.append(("create_repo", repo_id, kwargs))
        return f"https://huggingface.co/{repo_id}"

    def create_commit(self, repo_id, operations, **kwargs):
        FakeApi.calls.append(("create_commit", repo_id, {op.path_in_repo: op.path_or_fileobj for op in operations}))


@pytest.fixture
def hub(monkeypatch):
    import huggingface_hub

    FakeApi.calls = []
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    return FakeApi.calls


def test_push_uploads_the_final_model_its_card_and_the_run_record_in_one_commit(run_dir, hub, capsys):
    assert main(["push", str(run_dir), "--repo", "me/tiny-grpo", "--private"]) == 0
    (_, repo, options), (_, _, files) = hub
    assert repo == "me/tiny-grpo" and options == {"private": True, "exist_ok": True, "repo_type": "model"}
    assert {"README.md", "config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= set(files)
    record = {"reasonrl/config.yaml", "reasonrl/run.json", "reasonrl/summary.json", "reasonrl/metrics.jsonl"}
    assert record <= set(files) and files["model.safetensors"] == str(run_dir / "final" / "model.safetensors")
    card = files["README.md"].decode()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert card.startswith("---\nlibrary_name: transformers\n")
    assert "tags:\n- reasonrl\n- reinforcement-learning\n- grpo\n" in card
    assert "- base model: `tiny-random`" in card and "base_model:" not in card  # not a Hub id
    assert "- reward: the weighted sum of `tests.reward_functions:digit_share` × 1" in card
    assert "- data: `arithmetic`" in card and "preset: `grpo`" in card and "arXiv:2402.03300" in card
    assert f"| {summary['accuracy_before'] * 100:.1f}% | {summary['accuracy_after'] * 100:.1f}% |" in card
    assert "eps_high: 0.2" in card and 'from_pretrained("me/tiny-grpo")' in card
    assert json.loads(capsys.readouterr().out)["url"] == "https://huggingface.co/me/tiny-grpo"


def test_push_a_checkpoint_leaves_the_optimiser_state_out_and_a_dry_run_uploads_nothing(run_dir, hub, capsys):
    assert main(["push", str(run_dir), "--repo", "me/tiny", "--checkpoint", "1", "--dry-run"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert hub == []
    assert "model.safetensors" in report["files"] and "tokenizer_config.json" in report["files"]
    assert not {"trainer.pt", "state.json", "critic"} & set(report["files"])
    assert "this is the checkpoint `step-000001`" in report["model_card"]
    assert main(["push", str(run_dir), "--repo", "me/tiny", "--checkpoint", "latest"]) == 0
    assert hub[1][2]["model.safetensors"] == str(run_dir / "checkpoints" / "step-000002" / "model.safetensors")


def test_push_explains_what_is_missing(tmp_path, hub, capsys):
    assert main(["push", str(tmp_path), "--repo", "me/x"]) == 1
    assert f"{tmp_path} is not a reasonrl run directory (no config.yaml)" in capsys.readouterr().err
    (tmp_path / "config.yaml").write_text("{}\n")
    assert main(["push", str(tmp_path), "--repo", "me/x"]) == 1
    assert "no trained model in final/ yet; push a checkpoint with --checkpoint latest" in capsys.readouterr().err
    assert main(["push", str(tmp_path), "--repo", "me/x", "--checkpoint", "step-000009"]) == 1
    assert "has no complete checkpoint 'step-000009'" in capsys.readouterr().err
    assert hub == []


def test_a_lora_runs_adapter_is_uploaded_beside_the_merged_model(tmp_path):
    from reasonrl.jobs.push import upload_files

    model_dir = tmp_path / "final"
    (model_dir / "adapter").mkdir(parents=True)
    names = ["config.json", "model.safetensors", "adapter/adapter_config.json", "adapter/adapter_model.safetensors"]
    for name in names:
        (model_dir / name).write_text("{}")
    assert set(names) <= set(upload_files(tmp_path, model_dir))


def test_a_push_publishes_no_local_absolute_path(run_dir, hub, monkeypatch, tmp_path):
    from reasonrl.jobs.push import without_local_paths

    # a LoRA adapter's config names its base model by path; a reward file and a dataset are local paths
    adapter = run_dir / "final" / "adapter"
    adapter.mkdir(exist_ok=True)
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(tmp_path / "base")}))
    try:
        assert main(["push", str(run_dir), "--repo", "me/tiny"]) == 0
    finally:
        (adapter / "adapter_config.json").unlink()
        adapter.rmdir()
    uploaded = hub[-1][2]
    texts = {name: content.decode() for name, content in uploaded.items() if isinstance(content, bytes)}
    assert {
        "README.md",
        "config.json",
        "adapter/adapter_config.json",
        "reasonrl/config.yaml",
        "reasonrl/run.json",
    } <= set(texts)
    for name, text in texts.items():
        assert str(run_dir.parent) not in text and str(tmp_path) not in text, name
    assert json.loads(texts["adapter/adapter_config.json"]) == {"base_model_name_or_path": "base"}
    assert "output_dir: " in texts["reasonrl/config.yaml"]
    line = "functions: ['/home/me/rewards.py:score']; data /tmp/x/runs/r/final; eval/accuracy 1/2 https://hf.co/a/b"
    assert (
        without_local_paths(line, tmp_path)
        == "functions: ['rewards.py:score']; data final; eval/accuracy 1/2 https://hf.co/a/b"
    )
    assert without_local_paths(f"model {tmp_path}/final/adapter", tmp_path) == "model final/adapter"


def made_run(root):
    """A run directory as a finished run leaves it (by hand: no training), and a secret outside it."""
    secret = root / "home" / ".ssh" / "id_ed25519"
    secret.parent.mkdir(parents=True)
    secret.write_text("PRIVATE KEY")
    run_dir = root / "run"
    for name in ["final/config.json", "final/model.safetensors", "checkpoints/step-000001/config.json"]:
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_text("{}")
    (run_dir / "checkpoints" / "step-000001" / "state.json").write_text('{"step": 1}')
    (run_dir / "config.yaml").write_text("model:\n  name_or_path: tiny-random\n")
    return run_dir, secret


@pytest.mark.parametrize(
    "link", ["final/id_ed25519", "final/adapter", "final", "config.yaml", "metrics.jsonl", "checkpoints"]
)
def test_a_push_follows_no_link_and_refuses_naming_it(tmp_path, hub, capsys, link):
    run_dir, secret = made_run(tmp_path)
    (secret.parent / "config.json").write_text("{}")  # the folder looks like a model directory
    path = run_dir / link
    shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    path.symlink_to(secret if link in ("final/id_ed25519", "config.yaml", "metrics.jsonl") else secret.parent)
    checkpoint = ["--checkpoint", "latest"] if link == "checkpoints" else []
    for dry_run in (["--dry-run"], []):
        assert main(["push", str(run_dir), "--repo", "me/x", *checkpoint, *dry_run]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"reasonrl: error: {path} is a symbolic link (to {os.readlink(path)})")
    assert hub == []


def test_a_checkpoint_is_one_of_the_runs_own_whatever_latest_or_the_name_says(tmp_path, hub, capsys):
    run_dir, secret = made_run(tmp_path)
    outside = secret.parent / "step-000002"  # a complete checkpoint outside the run
    outside.mkdir()
    (outside / "config.json").write_text("{}")
    (outside / "state.json").write_text('{"step": 2}')
    (run_dir / "checkpoints" / "latest").write_text(f"../../{outside.relative_to(tmp_path)}")
    assert main(["push", str(run_dir), "--repo", "me/x", "--checkpoint", "latest", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == str(run_dir / "checkpoints" / "step-000001")
    (run_dir / "checkpoints" / "step-000002").symlink_to(outside)
    for name in ("2", "step-000002", f"../../{outside.relative_to(tmp_path)}"):
        assert main(["push", str(run_dir), "--repo", "me/x", "--checkpoint", name, "--dry-run"]) == 1
        assert f"has no complete checkpoint {name!r}" in capsys.readouterr().err
    assert hub == []


def test_a_model_with_nan_weights_is_never_pushed(tmp_path, run_dir, hub, capsys):
    """A model directory whose weights hold NaN (a run stops before it saves one; a file from elsewhere may) is
    refused, dry run or not, naming the weight."""
    from safetensors.torch import load_file, save_file

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, symlinks=True)
    weights_file = copy / "final" / "model.safetensors"
    weights = load_file(weights_file)
    name = sorted(weights)[0]
    weights[name][0] = float("nan")
    weights_file.unlink()  # a hard link to the checkpoint's: write a file of its own
    save_file(weights, str(weights_file), metadata={"format": "pt"})
    for dry_run in (["--dry-run"], []):
        assert main(["push", str(copy), "--repo", "me/x", *dry_run]) == 1
        assert f"the weight {name} holds NaN or infinity; such a model is not published" in capsys.readouterr().err
    assert hub == []
