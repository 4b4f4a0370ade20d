"""``fit()``: one RL run as named stages.

setup -> restore -> evaluate (before) -> value pretraining (critic presets)
each step: rollout (generate, score, filter, shape; T-PPO: one window of the rollout pool)
           -> log-probs (old, reference) -> values -> advantages -> policy update -> critic update
           -> weight sync -> evaluate? -> log -> checkpoint
-> evaluate (after) -> export -> report
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from reasonrl.algo.kl import kl_estimate
from reasonrl.algo.masked import masked_mean
from reasonrl.batch import ForwardTally, RolloutBatch, padding_summary
from reasonrl.config import Config, to_dict
from reasonrl.data.source import eval_examples
from reasonrl.models.forward import weight_casts_kept
from reasonrl.models.lora import adapters_disabled
from reasonrl.reward.verifier_protocol import Verifier
from reasonrl.rollout import RolloutEngine, SamplingParams
from reasonrl.rollout.scored import sample_and_score
from reasonrl.timing import timed
from reasonrl.training.backend import TrainingBackend, training_backend
from reasonrl.training.host_memory import host_memory_kept, release_free_memory
from reasonrl.training.offline_steps import REFERENCE_CACHE, compute_reference, offline_step
from reasonrl.training.placement.parallel import RemoteWorkers, join_data_parallel
from reasonrl.training.record.checkpoint import latest_checkpoint, rng_state, set_rng_state
from reasonrl.training.record.interrupt import UPDATE_PHASE, CtrlC
from reasonrl.training.record.metrics import (
    MetricsWriter,
    ProgressDisplay,
    device_memory_metrics,
    peak_rss_gb,
    read_metrics,
)
from reasonrl.training.record.report import CRITIC_PANELS, accuracy_meaning, plot_metrics, write_summary
from reasonrl.training.record.run_health import engine_gap
from reasonrl.training.record.rundir import RunRecord, claim, custom_objects, script_functions
from reasonrl.training.record.sample_log import SampleLog, step_samples
from reasonrl.training.record.trackers import Tracker, open_trackers
from reasonrl.training.rollouts.rollout_stage import hash_seed
from reasonrl.training.rollouts.rollout_stats import ground_truth_stats
from reasonrl.training.run_inputs import data_spec
from reasonrl.training.setup import Run, setup
from reasonrl.training.update.advantage_stage import assign_advantages
from reasonrl.training.update.policy import TokenLogprobs, head_tokens
from reasonrl.training.update.step import first_epoch_row_groups
from reasonrl.training.value_pretrain import pretrain_critic

log = logging.getLogger(__name__)
PLOT_NAME = "training_curves.png"
PRETRAINED_CRITIC = "critic_pretrained"
VALUE_PRETRAIN = "value_pretrain"  # its metrics file (.jsonl) and plot (.png)


def restore(run: Run) -> dict[str, Any]:
    """Continue from the latest checkpoint when resuming; returns its state (empty for a fresh run)."""
    checkpoint = latest_checkpoint(run.outputs.run_dir) if run.cfg.run.resume == "auto" else None
    if checkpoint is None:
        return {}
    state = run.backend.load_checkpoint(checkpoint, run.trained)
    run.rollout.load_state_dict(state)  # the prompt stream's position (T-PPO: and its pool)
    run.kl.coef = state["kl_coef"]
    run.updater.skipped_steps = state["skipped_steps"]
    run.backend.sync_engine(run.model, run.engine)
    log.info("resuming from %s (step %d)", checkpoint, state["step"])
    return state


def evaluate(run: Run) -> dict[str, float]:
    """Greedy accuracy on the held-out prompts: one answer each, or one episode each of the run's environment
    (``rollout.multiturn=tool|env``: the same turns, tools and reward as in training)."""
    examples = eval_examples(data_spec(run.cfg), run.cfg.data.eval_prompts)
    params = SamplingParams(max_new_tokens=run.cfg.rollout.max_response_tokens, temperature=0.0)
    timing: dict[str, float] = {}
    held_out = run.evaluation
    if held_out.episodes is not None:
        with timed(timing, "perf/eval_seconds"):
            episodes = held_out.episodes.evaluate(examples, params)
        return {**episodes, "eval/prompts": float(len(examples)), **timing}
    with timed(timing, "perf/eval_seconds"):
        scored = sample_and_score(run.engine, run.tokenizer, held_out.scorer, held_out.encoder, examples, params)
    lengths = [len(c.token_ids) for c in scored.completions]
    return {
        "eval/accuracy": sum(r.correct for r in scored.results) / max(1, len(scored.results)),
        "eval/prompts": float(len(scored.results)),  # over-long prompts are skipped
        "eval/response_length": sum(lengths) / max(1, len(lengths)),
        **ground_truth_stats(scored.results, "eval"),
        **timing,
    }


def value_pretrain_stage(run: Run, show_progress: bool | None) -> dict[str, Any]:
    """Train the critic on the frozen initial policy's rollouts, once per run (VC-PPO, VAPO).

    The pretrained critic is saved to ``critic_pretrained/``; a restarted run loads it from there
    instead of pretraining again.  Metrics go to ``value_pretrain.jsonl`` and ``value_pretrain.png``.
    """
    assert run.critic is not None
    outputs = run.outputs
    saved = outputs.run_dir / PRETRAINED_CRITIC
    main = run.parallel.is_main
    if run.backend.load_pretrained_critic(run.critic.model, saved):
        log.info("loaded the pretrained critic from %s", saved)
        return {}
    steps = run.plan.value_pretrain_steps
    timing: dict[str, float] = {}
    with timed(timing, "value_pretrain_seconds"):
        writer = MetricsWriter(outputs.run_dir, name=VALUE_PRETRAIN, trackers=outputs.trackers) if main else None
        show = show_progress if main else False
        with ProgressDisplay(steps, 0, show, "value pretraining", "rollout, critic update") as progress:

            def record(step: int, metrics: dict[str, float]) -> None:
                if writer is not None:
                    writer.write(step, metrics)
                progress.update(step, metrics)

            done = pretrain_critic(
                run.collector,
                run.critic,
                steps=steps,
                ev_target=run.cfg.algo.value_pretrain_ev_target,
                gamma=run.cfg.algo.gamma,
                seed=run.cfg.run.seed,
                on_step=record,
                calibrate_bias=run.cfg.critic.init == "policy",
            )
        explained = None
        if writer is not None:
            writer.close()
            records = read_metrics(writer.path)
            title = "value pretraining (policy frozen)"
            plot_metrics(records, outputs.run_dir / f"{VALUE_PRETRAIN}.png", title, CRITIC_PANELS)
            explained = records[-1].get("critic/explained_variance") if records else None
        run.backend.save_critic(run.critic.model, saved)
        release_free_memory()
    return {"value_pretrain_steps": done, "value_pretrain_explained_variance": explained, **timing}


def logprob_stage(run: Run, batch: RolloutBatch, seed: int) -> dict[str, float]:
    """Behaviour (old) log-probs from the trainer's own forward, and reference log-probs if a KL is on.

    Both run over the micro-batches of the update's first epoch (its ``seed``; ``first_epoch_row_groups``), so
    at identical weights they equal the update's own log-probs to the bit.  The LM head runs only where they
    are read (T-PPO's token filtering): old log-probs on every response token but earlier windows' (those
    keep their stored behaviour log-probs), reference log-probs also on those when the KL is in the reward
    (every token's reward) or in a loss that trains on them."""
    updater = run.updater
    packed, share_prompts, lanes = updater.policy.packed, updater.policy.share_prompts, updater.policy.lanes
    groups = first_epoch_row_groups(  # data-parallel: this rank's rows
        batch, updater.minibatch_sequences, seed, run.parallel, run.plan.microbatch_tokens, packed, share_prompts, lanes
    )
    stale = None if batch.pool_window is None else batch.pool_window.stale_mask  # [B, T]
    fresh = batch.response_mask if stale is None else batch.response_mask & ~stale
    lm_head_tokens = 0
    tallies = []

    def forward(policy: TokenLogprobs, needed: torch.Tensor, tally: ForwardTally) -> torch.Tensor:  # needed: [B, T]
        nonlocal lm_head_tokens
        out = torch.zeros(batch.response_mask.shape)
        tallies.append(tally)
        with torch.no_grad(), weight_casts_kept(policy.model):  # one bf16 cast per weight for the whole pass
            for rows in groups:
                part = batch.select(rows or [0])  # [] = a filler forward, kept in step
                tally.add(part, filler=not rows, packed=packed, share_prompts=share_prompts, lanes=lanes)
                head_mask = needed[rows or [0], : part.response_mask.shape[1]] & bool(rows)  # a filler: no head
                logprobs, _ = policy(part, head_mask=head_mask)
                lm_head_tokens += head_tokens(part, head_mask)
                out[rows, : logprobs.shape[1]] = logprobs.cpu()
        return run.parallel.sum_(out)

    batch.old_logprobs = forward(run.updater.policy, fresh, ForwardTally("logprob"))
    fire = run.cfg.rollout.fire
    if fire.enabled and fire.logprob == "behaviour":  # the FIRE tokens' true behaviour log-probs
        positions = list(fire.positions)
        batch.old_logprobs[:, positions] = batch.rollout_logprobs[:, positions]
    mask = batch.response_mask
    gap = (batch.old_logprobs - batch.rollout_logprobs).abs()
    if stale is not None:  # T-PPO: earlier windows' tokens were sampled by older policies
        mask = mask & ~stale  # the engine-vs-trainer gap is measured on this window's tokens
        batch.old_logprobs = torch.where(stale, batch.rollout_logprobs, batch.old_logprobs)
    stats = {
        "rollout/logprob_abs_diff": masked_mean(gap, mask).item(),
        "rollout/logprob_max_abs_diff": gap[mask].max().item() if mask.any() else 0.0,
    }
    if run.plan.uses_reference:
        needed = batch.response_mask if run.cfg.algo.kl_placement == "reward" else fresh | batch.policy_loss_mask
        if run.reference is not None:
            batch.ref_logprobs = forward(run.reference, needed, ForwardTally("reference"))
        else:  # LoRA: the policy with its adapters switched off
            with adapters_disabled(run.model):
                batch.ref_logprobs = forward(run.updater.policy, needed, ForwardTally("reference"))
        kl = kl_estimate(batch.old_logprobs, batch.ref_logprobs, run.cfg.algo.kl_estimator)
        stats["policy/kl_ref"] = masked_mean(kl, mask).item()
        stats["policy/kl_coef"] = float(run.kl.coef)
    counts = {"perf/lm_head_tokens_logprob": float(lm_head_tokens)} | {
        k: v for t in tallies for k, v in t.metrics().items()
    }
    stats |= run.parallel.sum_metrics(counts)
    return stats


def resume_state(run: Run) -> dict[str, Any]:
    """What a checkpoint's ``state.json`` holds of the run: the data position, the KL coefficient, the
    skipped steps and T-PPO's rollout pool (copies: the steps after do not change them)."""
    return {
        **run.rollout.state_dict(),
        "kl_coef": float(run.kl.coef),
        "skipped_steps": run.updater.skipped_steps,
    }


def checkpoint_stage(run: Run, step: int, extra: dict[str, Any], noted: dict[str, Any] | None = None) -> None:
    """Save everything needed to continue from ``step``: the models and optimisers as they are, and the
    run's ``resume_state`` as ``noted`` (when a step was abandoned: as it began) or as it is now."""
    state = {**(resume_state(run) if noted is None else noted), **extra}
    run.backend.save_checkpoint(
        run.outputs.run_dir, step, run.trained, state, run.cfg.run.keep_checkpoints, run.outputs.saved_tokenizer
    )


def export_stage(run: Run) -> Path:
    """The final policy as a Hugging Face directory (``from_pretrained`` loads it; with LoRA the merged
    model, and its adapter in ``final/adapter``): the last step's checkpoint's, hard-linked (``export_model``),
    so a run stores its final weights once; the checkpoint keeps the optimiser state a longer run resumes."""
    return run.backend.export(run.outputs.run_dir)


def rl_step(run: Run, step: int, phase: Callable[[str], None] = lambda name: None) -> dict[str, float]:
    """One rollout step: rollout -> log-probs -> values -> advantages -> policy update -> critic update
    -> weight sync (-> the adaptive KL coefficient); returns the step's metrics, each stage's time included.
    ``phase`` is told when the rollout and the update begin (the progress bar shows it; before "update"
    nothing a checkpoint holds has changed but what ``resume_state`` and the RNG states note)."""
    cfg, kl_coef, seed = run.cfg, float(run.kl.coef), hash_seed(run.cfg.run.seed, step)
    phase("rollout")
    batch, metrics = run.rollout.collect(step)
    rewarded = batch.rewards if batch.pool_window is None else batch.rewards[~batch.pool_window.running]
    run.health.check_rewards(step, rewarded)  # the same reward for every response, step after step: stop
    if run.plan.separate_old_logprob_pass:
        with timed(metrics, "perf/logprob_seconds"):
            metrics |= logprob_stage(run, batch, seed)
        run.health.check_engine(step, engine_gap(batch, step))  # did the last weight update reach the engine?
    if run.critic is not None:
        with timed(metrics, "perf/value_seconds"):
            batch.values = run.critic.values(batch, values_tally := ForwardTally("values"))
        metrics |= run.parallel.sum_metrics(values_tally.metrics())
    metrics |= assign_advantages(batch, cfg.algo, kl_coef)
    if (sample_log := run.outputs.sample_log) is not None:  # before the update (whose advantages they show)
        sample_log.write(step, step_samples(batch, run.tokenizer, cfg.run.log_samples, seed))
    phase(UPDATE_PHASE)
    run.engine.sleep()  # vLLM's sleep mode: the update gets its GPU memory; load_weights wakes it
    signal = bool(batch.advantages[batch.policy_loss_mask.bool()].any())
    metrics["train/no_signal_step"] = float(not signal)
    with timed(metrics, "perf/update_seconds"):
        if signal:  # every advantage zero: no update (a KL's float noise or an entropy bonus alone moves nothing)
            metrics |= run.updater.update(batch, seed=seed, kl_coef=kl_coef)
            run.health.check_gradients(step, metrics["train/grad_norm"])
            if not run.plan.separate_old_logprob_pass and batch.policy_versions is None:
                run.health.check_engine(step, metrics.get("rollout/logprob_abs_diff"))  # the update's own gap
    metrics["perf/batch_tokens"] = float(batch.prompt_mask.sum() + batch.response_mask.sum())
    metrics["perf/update_tokens_per_second"] = metrics["perf/batch_tokens"] / max(1e-9, metrics["perf/update_seconds"])
    if run.critic is not None:
        with timed(metrics, "perf/critic_update_seconds"):
            metrics |= run.critic.update(batch, seed=seed)
    metrics = padding_summary(metrics)
    with timed(metrics, "perf/weight_sync_seconds"):
        run.backend.sync_engine(run.model, run.engine)
    release_free_memory()
    if "policy/kl_ref" in metrics:
        run.kl.update(metrics["policy/kl_ref"], len(batch))
    return metrics


def train_step(run: Run, step: int, phase: Callable[[str], None] = lambda name: None) -> dict[str, float]:
    """An online RL step (``rl_step``), or with algo.offline a DPO/DQO step on the offline dataset
    followed by the weight sync the evaluation reads."""
    if run.offline is None:
        return rl_step(run, step, phase)
    phase(UPDATE_PHASE)
    run.engine.sleep()  # vLLM's sleep mode: the update gets its GPU memory; load_weights wakes it
    metrics = offline_step(run, run.offline, step)
    with timed(metrics, "perf/weight_sync_seconds"):
        run.backend.sync_engine(run.model, run.engine)
    release_free_memory()
    return metrics


def measured_step(run: Run, step: int, phase: Callable[[str], None]) -> dict[str, float]:
    """``train_step``, the evaluation when it is due (every ``run.eval_every`` steps and the last), and
    the step's pace and memory."""
    metrics: dict[str, float] = {}
    with timed(metrics, "perf/step_seconds"):
        metrics |= train_step(run, step, phase)
        if step % run.cfg.run.eval_every == 0 or step == run.cfg.train.rollout_steps:
            phase("eval")
            metrics |= evaluate(run)
    if "rollout/tokens_generated" in metrics:  # online steps
        tokens = metrics["rollout/tokens_generated"]
        metrics["perf/tokens_per_second"] = tokens / metrics["perf/step_seconds"]
        metrics["perf/generation_tokens_per_second"] = tokens / max(1e-9, metrics["perf/generate_seconds"])
    metrics["perf/peak_rss_gb"] = peak_rss_gb()
    metrics["perf/load_average"] = os.getloadavg()[0]  # other jobs on the machine slow every timing
    return metrics | device_memory_metrics(next(run.model.parameters()).device)


# --- the loop ------------------------------------------------------------------------------------


def fit(
    cfg: Config,
    run_dir: Path,
    *,
    preset: str = "custom",
    overrides: tuple[str, ...] = (),
    engine: RolloutEngine | None = None,
    verifier: Verifier | None = None,
    show_progress: bool | None = None,
    workers: RemoteWorkers | None = None,
    trackers: Sequence[Tracker] = (),
) -> dict[str, Any]:
    """Train according to ``cfg`` in ``run_dir``; returns the summary (also written to summary.json).
    ``show_progress``: as ``reasonrl.timing.Progress``'s ``show`` (None: a bar where stderr is a terminal).
    ``trackers``: where each step's metrics also go, besides those of ``run.loggers`` (the Python API's
    callbacks); on rank 0 only, as every tracker.

    A directory that holds a run continues it (``reasonrl.training.record.rundir``: same settings but for
    ``RESUMABLE_KEYS``; one live run at a time).  Ctrl-C raises ``TrainingInterrupted`` and a full
    disk ``DiskFullError``, each with the line that says how to resume.
    """
    custom = [*custom_objects(engine=engine, verifier=verifier), *script_functions(cfg)]
    backend = training_backend(join_data_parallel(cfg))  # chosen once: one process, or an FSDP2 rank
    parallel = backend.parallel
    run_dir = parallel.broadcast(run_dir)  # rank 0's (a timestamped name can differ between ranks)
    if not parallel.is_main:  # rank 0 holds the run directory; the others follow its record, or its refusal
        record = parallel.broadcast(None)
        if isinstance(record, Exception):
            raise record
        return run_fit(cfg, run_dir, record, engine, verifier, False, backend, workers, ())
    with contextlib.ExitStack() as held:
        try:
            backend.check_resumable(run_dir)  # as many processes as wrote the latest checkpoint
            record = held.enter_context(claim(run_dir, cfg, preset, overrides, custom))
        except Exception as exc:
            parallel.broadcast(exc)
            raise
        parallel.broadcast(record)
        return run_fit(cfg, run_dir, record, engine, verifier, show_progress, backend, workers, trackers)


def run_steps(
    run: Run,
    start_step: int,
    writer: MetricsWriter | None,
    show_progress: bool | None,
    accuracy_before: float | None,
    extra: Callable[[], dict[str, Any]],
    interruptible: bool,
) -> dict[str, Any]:
    """Steps ``start_step + 1`` to train.rollout_steps, each checkpointed every run.save_every steps and at the
    last (``extra()``: what a checkpoint keeps beside the models); returns the last step's evaluation ({} if none).
    Ctrl-C before a step's update saves the step before; during it, the step itself, then stops."""
    cfg, saved, after = run.cfg, start_step, {}  # the newest step with a checkpoint; the last step's evaluation
    total = cfg.train.rollout_steps
    with ProgressDisplay(total, start_step, enabled=show_progress) as progress, CtrlC(interruptible) as ctrl_c:
        progress.accuracy_before(accuracy_before)
        for step in range(start_step + 1, total + 1):
            noted = (resume_state(run), rng_state()) if ctrl_c.enabled else None  # as the step finds them
            try:
                ctrl_c.begin_step(step)
                metrics = measured_step(run, step, ctrl_c.watch(progress.phase))
            except KeyboardInterrupt:  # before the update: the step before is saved from what was noted
                if noted is not None and ctrl_c.abandons() and step - 1 > saved:
                    ctrl_c.saving(step - 1)
                    set_rng_state(noted[1])
                    checkpoint_stage(run, step - 1, extra(), noted[0])
                raise
            after = metrics if "eval/accuracy" in metrics else after
            if writer is not None:
                writer.write(step, metrics)
            progress.update(step, metrics)
            stopping = ctrl_c.end_step()  # a first Ctrl-C during the update: this step is saved, then it stops
            if step % cfg.run.save_every == 0 or step == total or stopping:
                progress.phase("checkpoint", step)
                ctrl_c.saving(step)
                checkpoint_stage(run, step, extra())
                saved = step
            if stopping:
                raise KeyboardInterrupt
    return after


def run_fit(
    cfg: Config,
    run_dir: Path,
    record: RunRecord,
    engine: RolloutEngine | None,
    verifier: Verifier | None,
    show_progress: bool | None,
    backend: TrainingBackend,
    workers: RemoteWorkers | None,
    trackers: Sequence[Tracker],
) -> dict[str, Any]:
    """``fit`` once the run directory is claimed (``record``): set up, restore, train the steps, export, sum up."""
    started = time.perf_counter()
    run = setup(cfg, run_dir, engine, verifier, backend, workers)
    main = backend.parallel.is_main  # rank 0 alone writes metrics, plots, the summary and the export
    # a CPU run reuses the host memory it frees, page faults avoided (reasonrl.training.host_memory)
    with host_memory_kept(next(run.model.parameters()).device.type == "cpu"):
        try:
            # 1. continue from the latest checkpoint (step 0 without one), open the metrics stream
            state = restore(run)
            start_step = state.get("step", 0)
            if main:
                run.outputs.trackers = [*open_trackers(cfg.run.loggers, run_dir, start_step, to_dict(cfg)), *trackers]
            writer = MetricsWriter(run_dir, start_step, trackers=run.outputs.trackers) if main else None
            if main and cfg.run.log_samples:
                run.outputs.sample_log = SampleLog(run_dir, start_step, writer.trackers)
            # 2. before the first step: the baseline evaluation, the offline reference's log-probs, value pretraining
            elapsed_before = state.get("wall_seconds", 0.0)
            accuracy_before = state.get("accuracy_before")
            if start_step == 0:
                before = evaluate(run)
                accuracy_before = before["eval/accuracy"]
                if writer is not None:
                    writer.write(0, before)
            if run.offline is not None:  # the reference's log-probs of the offline responses, once per run
                compute_reference(run, run.offline, run_dir / REFERENCE_CACHE)
            pretraining = state.get("value_pretraining", {})
            if start_step == 0 and run.plan.value_pretrain_steps:
                pretraining = value_pretrain_stage(run, show_progress)

            def extra() -> dict[str, Any]:
                wall = elapsed_before + time.perf_counter() - started
                return {"accuracy_before": accuracy_before, "wall_seconds": wall, "value_pretraining": pretraining}

            # 3. the steps; Ctrl-C saves first (reasonrl.training.record.interrupt): one process; torchrun's ranks and
            # Ray's stop at once
            interruptible = backend.saves_when_interrupted and workers is None
            after = run_steps(run, start_step, writer, show_progress, accuracy_before, extra, interruptible)
            # 4. the final evaluation, the export, the plot and the summary
            after = after or evaluate(run)
            final = export_stage(run)
            if writer is not None:
                writer.close()
                title = f"{record.preset}: {cfg.model.name_or_path}"
                plot_metrics(read_metrics(writer.path), run_dir / PLOT_NAME, title)
            summary = {
                "preset": record.preset,
                "run_dir": str(run_dir),
                "overrides": list(record.overrides),
                "model": cfg.model.name_or_path,
                "steps": cfg.train.rollout_steps,
                "eval_prompts": int(after.get("eval/prompts", cfg.data.eval_prompts)),  # those evaluated
                "accuracy_before": accuracy_before,
                "accuracy_after": after["eval/accuracy"],
                "accuracy_means": accuracy_meaning(cfg),
                "wall_seconds": elapsed_before + time.perf_counter() - started,
                "peak_rss_gb": peak_rss_gb(),
                "plot": PLOT_NAME,
                "final_model": final.name,
                **pretraining,
            }
            if main:
                write_summary(run_dir, summary)
            return summary
        finally:
            run.close()
            for tracker in run.outputs.trackers:
                tracker.close()
