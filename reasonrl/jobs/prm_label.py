"""`reasonrl prm label`: sample programs and label their lines by binary search (arXiv 2410.17621, Algorithm 1).

For each data policy (the initial policy, or evenly spaced checkpoints of an earlier RL run: the paper's
choice), ``programs_per_prompt`` programs are sampled per prompt and scored in the sandbox.  A program
that passes is all-positive.  For a failing one, the lines' binary search (``reward.prm.DeadLineSearch``) asks
whether a line prefix is alive: K completions of it are sampled from the same policy and run against
the tests, under the reward pool's sandbox limits and timeouts; alive if any passes.  Every program's
search advances in lockstep, so one engine call samples the completions of many prefixes.

Resumable: sampled programs and every probe (program, line, alive) are appended to ``OUT.progress`` as
they happen, and each labelled program to ``OUT``; a killed run started again reads both, skips the
labelled programs, replays the probes it has, and spends completions only on the rest.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from reasonrl.config import ConfigError, load_config
from reasonrl.data.code_tasks import parse_reference
from reasonrl.data.loaders import DataError, append_record, read_records
from reasonrl.jobs.prompt_sampling import InitialPolicy, prompt_rows, stable_seed
from reasonrl.reward.code import defines
from reasonrl.reward.prm import DeadLineSearch, Line, line_labels, response_lines, token_char_ends
from reasonrl.reward.router import build_router
from reasonrl.rollout import SamplingParams
from reasonrl.rollout.scored import sample_and_score
from reasonrl.timing import Progress

PROMPTS_PER_SAMPLING_CALL = 16  # prompts sampled (× programs_per_prompt) per engine call
PROBES_PER_CALL = 8  # line prefixes probed (× K completions) per engine call


@dataclass(frozen=True)
class PRMLabelRun:
    """What ``reasonrl prm label`` runs (arXiv 2410.17621, Algorithm 1: binary-search line labels)."""

    model: str = "smollm2-135m"
    """The initial policy (a spec as model.name_or_path): it samples the programs and the completions
    with data_policy=initial."""

    dataset: str = "mbpp"
    """Code problems with unit tests: a built-in set (mbpp, humaneval) or a jsonl of code tasks."""

    split: str = "train"
    """The dataset's split (auto: train where there is one, else its only split)."""

    limit: int | None = None
    """Label the programs of the first N prompts only; None = every prompt."""

    programs_per_prompt: int = 4
    """n: programs sampled per prompt and policy."""

    completions: int = 20
    """K: completions sampled from a line prefix to decide whether it is alive (the paper's 20)."""

    max_new_tokens: int = 256
    """Cap on a program's tokens; a completion gets what the cap leaves after its prefix."""

    temperature: float = 1.0
    """Sampling temperature of the programs and the completions."""

    data_policy: str = "initial"
    """Who samples: initial (the model above; no extra run), or an earlier RL run directory whose
    evenly spaced checkpoints do (the paper's choice: 4 checkpoints of the RL baseline run)."""

    checkpoints: int = 4
    """data_policy = a run directory: how many of its checkpoints, evenly spaced, ending at the last."""

    out: str = "runs/prm-labels.jsonl"
    """The labelled programs, one JSON line each; OUT.progress holds the work in flight (resume)."""

    seed: int = 0
    """Seed of the sampling."""

    overrides: tuple[str, ...] = ()
    """`reasonrl train`-style KEY=VALUE settings for the engine and the sandbox (rollout.engine,
    reward.timeout_seconds, reward.workers, ...)."""

    def check(self) -> None:
        """Refuse settings that cannot label anything (ConfigError naming each problem)."""
        checks = [
            (self.programs_per_prompt >= 1, f"--programs-per-prompt must be >= 1, got {self.programs_per_prompt}"),
            (self.completions >= 1, f"--completions must be >= 1, got {self.completions}"),
            (self.max_new_tokens >= 2, f"--max-new-tokens must be >= 2, got {self.max_new_tokens}"),
            (self.temperature > 0, f"--temperature must be > 0, got {self.temperature}"),
            (self.checkpoints >= 1, f"--checkpoints must be >= 1, got {self.checkpoints}"),
            (self.limit is None or self.limit >= 1, f"--limit must be >= 1, got {self.limit}"),
        ]
        problems = [message for ok, message in checks if not ok]
        if problems:
            raise ConfigError("; ".join(problems))


@dataclass
class Program:
    """A sampled program and what labelling it has cost so far."""

    key: str  # policy/example id/sample index
    policy: str
    example_id: str
    group: str  # what keeps its programs on one side of the PRM's held-out split: the function under test
    prompt_token_ids: list[int]
    response_token_ids: list[int]
    response: str
    lines: list[Line]
    passed: bool
    probes: dict[int, bool] = field(default_factory=dict)  # line -> alive
    completions: int = 0
    sandbox_seconds: float = 0.0

    def record(self) -> dict:
        return {
            "kind": "program",
            "key": self.key,
            "policy": self.policy,
            "example_id": self.example_id,
            "group": self.group,
            "prompt_token_ids": self.prompt_token_ids,
            "response_token_ids": self.response_token_ids,
            "response": self.response,
            "lines": [line.to_json() for line in self.lines],
            "passed": self.passed,
        }

    @staticmethod
    def from_record(row: dict) -> Program:
        lines = [Line.from_json(line) for line in row["lines"]]
        fields = {k: row[k] for k in ("key", "policy", "example_id", "group", "prompt_token_ids", "response_token_ids")}
        return Program(**fields, response=row["response"], lines=lines, passed=row["passed"])


class LabelStore:
    """``OUT`` (labelled programs, one JSON line each) and ``OUT.progress`` (sampled programs and probes)."""

    def __init__(self, out: Path, settings: dict | None = None) -> None:
        self.out, self.progress = out, out.with_name(out.name + ".progress")
        out.parent.mkdir(parents=True, exist_ok=True)
        self.labelled = {row["key"] for row in read_records(out)}
        self.programs: dict[str, Program] = {}
        records = read_records(self.progress)
        if settings is not None:
            started = next((r["settings"] for r in records if r["kind"] == "settings"), None)
            if started is None:
                append_record(self.progress, {"kind": "settings", "settings": settings})
            elif started != settings:
                changed = ", ".join(sorted(k for k in settings if started.get(k) != settings[k]))
                raise DataError(
                    f"{out} was started with other settings ({changed}); continue it with the same ones, "
                    "or give another --out"
                )
        for record in records:
            if record["kind"] == "settings":
                continue
            if record["kind"] == "program":
                self.programs[record["key"]] = Program.from_record(record)
            else:
                program = self.programs[record["key"]]
                program.probes[record["line"]] = record["alive"]
                program.completions += record["completions"]
                program.sandbox_seconds += record["sandbox_seconds"]

    def add_program(self, program: Program) -> None:
        self.programs[program.key] = program
        append_record(self.progress, program.record())

    def add_probe(self, program: Program, line: int, alive: bool, completions: int, sandbox_seconds: float) -> None:
        program.probes[line] = alive
        program.completions += completions
        program.sandbox_seconds += sandbox_seconds
        append_record(self.progress, {"kind": "probe", "key": program.key, "line": line, "alive": alive,
                                "completions": completions, "sandbox_seconds": sandbox_seconds})  # fmt: skip

    def finish(self, program: Program, first_dead: int | None, completions_per_probe: int) -> None:
        # exhaustive labelling probes every prefix of a failing program but the whole (known dead) one
        probed_lines = 0 if program.passed else max(0, len(program.lines) - 1)
        row = {
            "key": program.key,
            "policy": program.policy,
            "example_id": program.example_id,
            "group": program.group,
            "prompt_token_ids": program.prompt_token_ids,
            "response_token_ids": program.response_token_ids,
            "response": program.response,
            "lines": [line.to_json() for line in program.lines],
            "labels": line_labels(None if program.passed else first_dead, len(program.lines)),
            "first_dead_line": None if program.passed else first_dead,
            "passed": program.passed,
            "completions": program.completions,
            "completions_exhaustive": completions_per_probe * probed_lines,
            "sandbox_seconds": program.sandbox_seconds,
        }
        self.labelled.add(program.key)
        append_record(self.out, row)


def data_policies(settings: PRMLabelRun) -> list[tuple[str, str]]:
    """(name, model spec) of each policy that samples programs: ``initial`` (settings.model), or
    ``settings.checkpoints`` checkpoints evenly spaced over the run directory ``settings.data_policy``."""
    if settings.data_policy == "initial":
        return [("initial", settings.model)]
    root = Path(settings.data_policy) / "checkpoints"
    saved = sorted(p for p in root.glob("step-*") if p.is_dir() and (p / "state.json").exists())
    if not saved:
        raise FileNotFoundError(
            f"--data-policy {settings.data_policy}: no checkpoints under {root}; give a run directory whose "
            "run kept its checkpoints (run.keep_checkpoints), or --data-policy initial"
        )
    count = min(settings.checkpoints, len(saved))
    picks = sorted({round((i + 1) * len(saved) / count) - 1 for i in range(count)})
    return [(saved[i].name, str(saved[i])) for i in picks]


def _chunks(items: Sequence, size: int) -> Iterator[Sequence]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def sample_programs(policy, scorer, examples, name: str, settings: PRMLabelRun, store: LabelStore, advance) -> None:
    """Sample and score ``programs_per_prompt`` programs per prompt; a resumed run samples only the prompts
    that lack some, and keeps the programs it has (the probes it recorded refer to them)."""

    def key(example, sample: int) -> str:
        return f"{name}/{example.id}/{sample}"

    n = settings.programs_per_prompt
    todo = [e for e in examples if any(key(e, j) not in store.programs for j in range(n))]
    advance(len(examples) - len(todo))
    for chunk in _chunks(todo, PROMPTS_PER_SAMPLING_CALL):
        seed = stable_seed(settings.seed, name, chunk[0].id)
        params = SamplingParams(settings.max_new_tokens, settings.temperature, seed=seed)
        scored = sample_and_score(
            policy.engine, policy.tokenizer, scorer, policy.encoder, chunk, params, settings.programs_per_prompt
        )
        rows = zip(scored.examples, scored.completions, scored.results, strict=True)
        for row, (example, completion, result) in enumerate(rows):
            ids = list(completion.token_ids)
            text = policy.tokenizer.decode(ids, skip_special_tokens=True)
            if key(example, row % n) in store.programs:  # kept from a killed run (its probes refer to it)
                continue
            store.add_program(Program(
                key(example, row % n), name, example.id, parse_reference(example.answer)[1] or example.id,
                list(scored.prompts[row]), ids, text, response_lines(text, token_char_ends(policy.tokenizer, ids)),
                bool(result.correct),
            ))  # fmt: skip
        advance(len(chunk))


def continuation(prefix: str, completion: str, entry_point: str | None) -> str | None:
    """The part of ``completion`` that continues the program of ``prefix``, or None when it abandons it.

    A completion must not replace the prefix's code: inside an open code fence it ends at the fence's
    close (the verifier would otherwise run a later block), and once the prefix defines the function
    under test, a completion that defines it again starts over (a later definition wins in Python)."""
    if prefix.count("```") % 2 == 1 and "```" in completion:
        completion = completion[: completion.index("```") + 3]
    if entry_point and defines(prefix, entry_point) and defines(completion, entry_point):
        return None
    return completion


def probe_prefixes(policy, scorer, examples, probes: Sequence[tuple[Program, int]], settings: PRMLabelRun, seed: int):
    """Whether each (program, ℓ) prefix is alive: K completions each, sampled in one engine call, cut to
    what continues the prefix (``continuation``) and run against the program's tests; (alive, sandbox
    seconds) per probe.  A completion that abandons the prefix counts as failing."""
    K, decode = settings.completions, policy.tokenizer.decode
    prefixes = [program.response_token_ids[: program.lines[line - 1].end_token + 1] for program, line in probes]
    prompts = [program.prompt_token_ids + prefix for (program, _), prefix in zip(probes, prefixes, strict=True)]
    budget = max(1, settings.max_new_tokens - min(len(prefix) for prefix in prefixes))
    completions = policy.engine.generate(
        [prompt for prompt in prompts for _ in range(K)], SamplingParams(budget, settings.temperature, seed=seed)
    )
    texts, rows, kept = [], [], []  # kept: (probe, completion) pairs that continue their prefix
    for j, ((program, _), prefix) in enumerate(zip(probes, prefixes, strict=True)):
        example = examples[program.example_id]
        prefix_text = decode(prefix, skip_special_tokens=True)
        for completion in completions[j * K : (j + 1) * K]:
            ids = prefix + list(completion.token_ids)[: settings.max_new_tokens - len(prefix)]
            tail = continuation(prefix_text, decode(ids, skip_special_tokens=True)[len(prefix_text) :],
                                parse_reference(example.answer)[1])  # fmt: skip
            if tail is not None:
                texts.append(prefix_text + tail)
                rows.append(example)
                kept.append(j)
    results = scorer.score_examples(rows, texts) if texts else []
    alive, seconds = [False] * len(probes), [0.0] * len(probes)
    for j, result in zip(kept, results, strict=True):
        alive[j] = alive[j] or bool(result.correct)
        seconds[j] += float(result.info.get("wall_seconds", 0.0))
    return list(zip(alive, seconds, strict=True))


def label_programs(policy, scorer, examples, name: str, settings: PRMLabelRun, store: LabelStore, advance) -> None:
    """Binary-search the first dead line of every unlabelled program of policy ``name``, in lockstep
    (``examples``: the problems by id)."""
    searches: dict[str, tuple[Program, DeadLineSearch]] = {}
    for program in store.programs.values():
        if program.policy != name or program.key in store.labelled:
            continue
        # a passing program's lines are all alive; a failing one's last prefix (the whole program) is dead
        search = DeadLineSearch(0 if program.passed else len(program.lines) - 1)
        while search.query is not None and search.query in program.probes:  # replay a resumed run's probes
            search.tell(program.probes[search.query])
        searches[program.key] = (program, search)
    calls = 0
    while searches:
        # 1. programs whose search is over are labelled
        for key, (program, search) in list(searches.items()):
            if search.query is None:
                first_dead = search.result if search.result is not None else len(program.lines)
                store.finish(program, None if program.passed else first_dead, settings.completions)
                del searches[key]
                advance(1)
        # 2. every other program probes the prefix its search asks for, PROBES_PER_CALL per engine call
        for chunk in _chunks(list(searches.values()), PROBES_PER_CALL):
            probes = [(program, search.query) for program, search in chunk]
            seed = stable_seed(settings.seed, name, "probe", calls, len(store.labelled))
            calls += 1
            for (program, search), (alive, seconds) in zip(
                chunk, probe_prefixes(policy, scorer, examples, probes, settings, seed), strict=True
            ):
                store.add_probe(program, search.query, alive, settings.completions, seconds)
                search.tell(alive)


def summarise(store: LabelStore, settings: PRMLabelRun, wall_seconds: float) -> dict:
    """What the labelling cost and found, over every labelled program in OUT."""
    rows = read_records(store.out)
    failing = [r for r in rows if not r["passed"]]
    spent = sum(r["completions"] for r in rows)
    exhaustive = sum(r["completions_exhaustive"] for r in rows)
    labels = [x for r in rows for x in r["labels"]]
    return {
        "out": str(store.out),
        "data_policies": sorted({r["policy"] for r in rows}),
        "programs": len(rows),
        "programs_passed": len(rows) - len(failing),
        "lines": len(labels),
        "positive_line_fraction": sum(labels) / max(1, len(labels)),
        "completions_per_probe": settings.completions,
        "completions_spent": spent,
        "completions_exhaustive": exhaustive,
        "completions_spent_over_exhaustive": spent / exhaustive if exhaustive else None,
        "sandbox_seconds": sum(r["sandbox_seconds"] for r in rows),
        "wall_seconds": wall_seconds,
    }


def run_labelling(settings: PRMLabelRun, progress: bool | None = False) -> dict:
    """Sample and label (or continue labelling) into ``settings.out``; returns the summary.
    ``progress``: show both passes on stderr (``reasonrl.timing.Progress``'s ``show``)."""
    settings.check()
    started = time.perf_counter()
    fixed = ("model", "dataset", "split", "programs_per_prompt", "completions", "max_new_tokens", "temperature",
             "data_policy", "checkpoints", "seed")  # fmt: skip
    store = LabelStore(Path(settings.out), {name: getattr(settings, name) for name in fixed})
    policies = data_policies(settings)
    with Progress("prm label", progress) as shown:
        for name, spec in policies:
            cfg = load_config(None, [f"model.name_or_path={spec}", *settings.overrides])
            examples = prompt_rows(cfg, settings.dataset, settings.split, settings.limit)
            if any(e.task_type != "code" for e in examples):
                raise ValueError(f"{settings.dataset} is not a code dataset: prm label needs programs with unit tests")
            policy = InitialPolicy.load(cfg)
            scorer = build_router(policy.cfg.reward, policy.cfg.model.name_or_path, policy.dtype)
            try:
                shown.stage(f"{name} sampling", len(examples), "prompts")
                sample_programs(policy, scorer, examples, name, settings, store, shown.advance)
                mine = [p for p in store.programs.values() if p.policy == name]
                shown.stage(f"{name} labelling", len(mine), "programs", done=sum(p.key in store.labelled for p in mine))
                label_programs(policy, scorer, {e.id: e for e in examples}, name, settings, store, shown.advance)
            finally:
                scorer.close()
    return summarise(store, settings, time.perf_counter() - started)
