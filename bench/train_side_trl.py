"""TRL 1.16's GRPO loss path on the rows of bench/train_side.py: ``GRPOTrainer``'s own ``compute_loss`` for
the update and its ``_get_per_token_logps_and_entropies`` for the log-prob pass, on rows padded as TRL pads
a generation batch; ``trl_liger``: with ``use_liger_kernel=True``, which in TRL 1.16 applies Liger's layer kernels
(RMSNorm, RoPE, SwiGLU) beside TRL's own fused LM head."""

from __future__ import annotations


class TrlPasses:
    """TRL 1.16's GRPOTrainer on the same rows: its ``compute_loss`` and its log-prob forward."""

    def __init__(self, model, device, dtype, packed: bool, sweep) -> None:
        import tempfile

        import torch
        from datasets import Dataset
        from tokenizers import Tokenizer, models
        from transformers import PreTrainedTokenizerFast
        from trl import GRPOConfig, GRPOTrainer

        words = Tokenizer(models.WordLevel({"<pad>": 0, "<unk>": 1}, unk_token="<unk>"))  # ids come ready-made
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, pad_token="<pad>", eos_token="<pad>")
        self.workdir = tempfile.TemporaryDirectory()
        self.config = GRPOConfig(
            output_dir=self.workdir.name,
            per_device_train_batch_size=2,
            num_generations=2,
            bf16=dtype == torch.bfloat16,
            use_liger_kernel=sweep.implementation == "trl_liger",  # Liger's layer kernels (liger-kernel)
            use_cpu=device.type == "cpu",
            report_to="none",
            save_strategy="no",
        )
        reward = lambda completions, **kwargs: [0.0] * len(completions)  # noqa: E731
        dataset = Dataset.from_list([{"prompt": "-"}] * 2)
        self.trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=reward, args=self.config,
                                   train_dataset=dataset)  # fmt: skip
        if self.config.use_liger_kernel:  # as Trainer.train() applies it: Liger's RMSNorm, RoPE and SwiGLU kernels
            from transformers.integrations.liger import apply_liger_kernel

            apply_liger_kernel(model, self.config.liger_kernel_config)
        if self.config.gradient_checkpointing:  # as Trainer.train() switches it on
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=self.config.gradient_checkpointing_kwargs)
        self.trainer.create_optimizer()
        self.model, self.device = model, device

    def configure(self, cap: int, rows: int, prompt_tokens: tuple[int, int]) -> dict:
        from reasonrl.config.plan import MICROBATCH_TOKENS

        self.budget = max(MICROBATCH_TOKENS[self.device.type], cap + prompt_tokens[1])  # reasonrl's default budget
        options = ("loss_type", "beta", "gradient_checkpointing", "bf16", "cast_lm_head_to_fp32", "learning_rate",
                   "use_liger_kernel")  # fmt: skip
        return {"microbatch_tokens": self.budget, "trl_options": {k: getattr(self.config, k) for k in options}}

    def padded(self, batch) -> tuple[list[dict], int]:
        """The rows as TRL's inputs: the batch padded to its widest prompt and answer, in micro-batches of as
        many rows as fit the token budget (TRL's per_device_train_batch_size); and those rows per micro-batch."""
        width = batch.prompt_ids.shape[1] + batch.response_ids.shape[1]
        per_micro = max(1, self.budget // width)
        inputs = {
            "prompt_ids": batch.prompt_ids,
            "prompt_mask": batch.prompt_mask.long(),
            "completion_ids": batch.response_ids,
            "completion_mask": batch.response_mask.long(),
            "advantages": batch.advantages[:, 0],
        }
        micros = []
        for start in range(0, len(batch), per_micro):
            micro = {k: v[start : start + per_micro].to(self.device) for k, v in inputs.items()}
            micro["num_items_in_batch"] = batch.response_mask.sum().to(self.device)
            micros.append(micro)
        return micros, per_micro

    def logprob_pass(self, batch) -> None:
        import torch

        micros, per_micro = self.padded(batch)
        ids = torch.cat([torch.cat([m["prompt_ids"], m["completion_ids"]], 1) for m in micros])
        mask = torch.cat([torch.cat([m["prompt_mask"], m["completion_mask"]], 1) for m in micros])
        self.model.eval()
        with torch.no_grad():
            self.trainer._get_per_token_logps_and_entropies(
                self.model, ids, mask, batch.response_ids.shape[1], batch_size=per_micro
            )

    def update(self, batch) -> None:
        micros, _ = self.padded(batch)
        trainer = self.trainer
        trainer.current_gradient_accumulation_steps = trainer.args.steps_per_generation = len(micros)
        self.model.train()
        for micro in micros:
            trainer.accelerator.backward(trainer.compute_loss(self.model, micro))
        trainer.accelerator.clip_grad_norm_(self.model.parameters(), trainer.args.max_grad_norm)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
