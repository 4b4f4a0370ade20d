"""bench/gpu_rl_step.py: the stop schedule makes every engine end every answer where the schedule says, and the
cpu profile's smoke times a whole dapo step of reasonrl and of TRL's GRPOTrainer on the same work."""

import importlib.util
import json
import subprocess
import sys

import torch

from tests.bench.smoke import ROOT

sys.path.insert(0, str(ROOT / "bench"))
SPEC = importlib.util.spec_from_file_location("gpu_rl_step", ROOT / "bench" / "gpu_rl_step.py")
gpu_rl_step = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(gpu_rl_step)


def scheduled_length(ends: dict[int, int], letter: int, prompt_tokens: int) -> int:
    """Tokens an answer of ``letter`` generates after ``prompt_tokens`` positions: its letters up to its end
    position (at least one), then the stop token."""
    return max(ends[letter] - prompt_tokens, 1) + 1


def test_generate_and_continuous_batching_answer_one_letter_up_to_its_scheduled_end(tmp_path):
    from transformers import AutoTokenizer, GenerationConfig, Qwen2ForCausalLM

    model_dir = gpu_rl_step.build_random_model("qwen2.5-0.5b", tmp_path / "model", smoke=True, real_vocabulary=True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [p for p, _ in gpu_rl_step._prompts(3)]
    ends = gpu_rl_step.letter_ends(tokenizer, 24, prompts)
    assert len(set(ends.values())) > 5  # a long-tailed mix of ends

    class Steered(Qwen2ForCausalLM):  # a subclass: the test process's Qwen2 stays as it is
        pass

    gpu_rl_step.install_stop_schedule(Steered, ends, tokenizer.eos_token_id)
    model = Steered.from_pretrained(model_dir, dtype=torch.float32).eval()
    chats = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                           tokenize=True, return_dict=True)["input_ids"] for p in prompts]  # fmt: skip
    width = max(map(len, chats))
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(c)) + c for c in chats * 4])  # left-padded
    mask = (torch.arange(width) >= torch.tensor([width - len(c) for c in chats * 4])[:, None]).long()
    torch.manual_seed(0)
    stops = dict(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=64, **stops)[:, width:]
    letters = set()
    for answer, chat in zip(out.tolist(), chats * 4, strict=True):
        letter, n = answer[0], answer.index(tokenizer.eos_token_id) + 1
        assert letter in ends and answer[: n - 1] == [letter] * (n - 1)  # one letter, then the stop token
        assert n == scheduled_length(ends, letter, len(chat))  # each row's own positions, padding not counted
        letters.add(letter)
    assert len(letters) > 3  # the letter is drawn, not fixed

    generation = GenerationConfig(do_sample=True, max_new_tokens=64, eos_token_id=tokenizer.eos_token_id,
                                  pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    results = model.generate_batch(chats * 2, generation_config=generation, progress_bar=False)
    for i, chat in enumerate(chats * 2):
        answer = results[f"req_{i}"].generated_tokens
        assert answer[:-1] == [answer[0]] * (len(answer) - 1) and answer[-1] == tokenizer.eos_token_id
        assert len(answer) == scheduled_length(ends, answer[0], len(chat))  # each request's own positions


def test_the_cpu_smoke_times_a_dapo_step_of_reasonrl_and_of_trl_on_the_same_work(tmp_path):
    command = [sys.executable, str(ROOT / "bench" / "gpu_rl_step.py"), "--profile", "cpu", "--smoke",
               "--arms", "reasonrl_paged", "trl_generate", "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_rl_step_cpu_smoke.json").read_text())
    trl = importlib.util.find_spec("trl") is not None  # the bench extra; CI's dev install has no TRL
    assert set(result["arms"]) == {"reasonrl_paged", *(["trl_generate"] if trl else [])}
    assert set(result["skipped"]) == (set() if trl else {"trl_generate"})
    assert result["device"] == "cpu" and result["cap"] == 32
    for arm in result["arms"].values():
        assert len(arm["steps"]) == 2 and arm["steps_timed"] == 1  # the first step warms up
        assert arm["seconds"] >= arm["generate"] > 0 and arm["update"] > 0
        assert all(0 < s["generated_tokens"] <= 8 * 32 < s["step_tokens"] for s in arm["steps"])
    reasonrl = result["arms"]["reasonrl_paged"]
    assert "rollout.engine=paged" in reasonrl["overrides"]
    if trl:
        assert result["speedup_over"]["trl_generate"] == round(
            result["arms"]["trl_generate"]["seconds"] / reasonrl["seconds"], 3
        )
