"""Actor, reference and rollout in one worker (upstream's integrated mode)."""
import functools
import importlib.util
import time
from typing import Dict, List

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from mindspeed_rl.models.causal_lm import CausalLMEngine
from mindspeed_rl.models.loss.grpo_loss import grpo_loss
from mindspeed_rl.models.lr_schedule import lr_at
from mindspeed_rl.utils.dist_sync import all_reduce_scalar, sync_micro_batch_count
from mindspeed_rl.utils.seqlen_balancing import rearrange_micro_batches
from mindspeed_rl.workers.base_worker import BaseWorker

SEQ_COLUMNS = ["prompts", "responses", "prompt_length", "response_length"]


def _lengths(batch) -> List[int]:
    return [int(p) + int(r) for p, r in zip(batch["prompt_length"], batch["response_length"])]


class IntegratedWorker(BaseWorker):
    def initialize(self, model_path: str, eos_id: int, pad_id: int):
        cfg, rl = self.megatron_config, self.rl_config
        half = torch.bfloat16 if cfg.bf16 and self.device.type != "cpu" else None
        common = dict(device=self.device, use_remove_padding=rl.use_remove_padding, seed=rl.seed,
                      pad_id=pad_id, attn_implementation=self._attention())
        # actor: fp32 master weights, bf16 compute; reference: frozen bf16 weights
        self.actor = CausalLMEngine(model_path, trainable=True, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                    betas=(cfg.adam_beta1, cfg.adam_beta2), clip_grad=cfg.clip_grad,
                                    process_group=self.parallel_state.dp_group, dtype=torch.float32,
                                    autocast_dtype=half, lr_schedule=self._lr_schedule(), **common)
        self.ref = CausalLMEngine(model_path, trainable=False, dtype=half or torch.float32,
                                  **common) if self._needs_ref() else None
        self.eos_id, self.pad_id = eos_id, pad_id
        self._generate_calls = 0
        return self.rank

    def _lr_schedule(self):
        """Per optimizer step: train_iters x mini-batches per iteration x epochs steps in all."""
        cfg, rl = self.megatron_config, self.rl_config
        total = cfg.train_iters * (self._total_rows() // rl.mini_batch_size) * rl.epochs
        warmup = int(cfg.lr_warmup_fraction * total)
        return functools.partial(lr_at, base_lr=cfg.lr, min_lr=cfg.min_lr, total_steps=total,
                                 warmup_steps=warmup, style=cfg.lr_decay_style)

    def _attention(self):
        """flash_attention_2 on CUDA when asked for (use_flash_attn) and installed; else the HF default."""
        if not (self.megatron_config.use_flash_attn and self.device.type == "cuda"):
            return None
        return "flash_attention_2" if importlib.util.find_spec("flash_attn") else None

    def _needs_ref(self) -> bool:
        return self.rl_config.init_kl_coef > 0

    # ------------------------------------------------------------ micro-batches

    def _micro_batches(self, lengths: List[int], fixed_size, sync: bool) -> List[List[int]]:
        """Index lists per micro-batch: token-capped (dynamic batch size) or
        fixed-size; with ``sync`` every DP rank gets the same count."""
        n = len(lengths)
        rl = self.rl_config
        if rl.use_dynamic_bsz:
            parts = rearrange_micro_batches(lengths, rl.max_packing_token_size)
            if sync:
                count = sync_micro_batch_count(len(parts), self.parallel_state.dp_group)
                if count > len(parts):
                    parts = rearrange_micro_batches(lengths, rl.max_packing_token_size, min_num_micro_batches=count)
            return parts
        size = max(1, fixed_size or n)
        count = -(-n // size)
        if sync:
            count = sync_micro_batch_count(count, self.parallel_state.dp_group)
        return [chunk.tolist() for chunk in np.array_split(np.arange(n), count)]

    # ------------------------------------------------------------ stages

    def generate_sequences(self) -> Dict[str, float]:
        start = time.perf_counter()
        sampling = self.generate_config.sampling_config
        count = self._dispatch(self.rl_config.actor_rollout_dispatch_size)
        for batch, index in self.iterate_stage("actor_rollout", ["prompts"], count, get_n_samples=False):
            seed = self.rl_config.seed + 7919 * self.parallel_state.dp_rank + self._generate_calls
            self._generate_calls += 1
            responses = self.actor.generate(batch["prompts"], max_new_tokens=sampling["max_tokens"],
                                            temperature=sampling["temperature"], top_p=sampling["top_p"],
                                            top_k=max(0, sampling["top_k"]), eos_id=self.eos_id, pad_id=self.pad_id,
                                            seed=seed)
            lengths = [torch.tensor([r.numel()], dtype=torch.int32) for r in responses]
            self.collect_transfer_dock_data({"responses": responses, "response_length": lengths}, index)
        return self._timing("rollout", start)

    def _log_prob_stage(self, stage: str, engine, out_column: str, dispatch_size, forward_mbs):
        start = time.perf_counter()
        tokens = 0
        for batch, index in self.iterate_stage(stage, SEQ_COLUMNS, dispatch_size,
                                               max_batches=self._requests_per_rank(dispatch_size)):
            lengths = _lengths(batch)
            tokens += sum(lengths)
            parts = self._micro_batches(lengths, forward_mbs, sync=False)
            log_probs, _ = engine.log_probs(batch["prompts"], batch["responses"], parts,
                                            temperature=self._temperature())
            self.collect_transfer_dock_data({out_column: log_probs}, index)
        return self._timing(stage, start, tokens)

    def compute_ref_log_prob(self) -> Dict[str, float]:
        rl = self.rl_config
        return self._log_prob_stage("ref_log_prob", self.ref, "ref_log_prob", self._dispatch(rl.ref_dispatch_size),
                                    rl.ref_forward_micro_batch_size)

    def compute_log_prob(self) -> Dict[str, float]:
        rl = self.rl_config
        return self._log_prob_stage("actor_log_prob", self.actor, "old_log_prob",
                                    self._dispatch(rl.actor_logprob_dispatch_size), rl.actor_forward_micro_batch_size)

    def _total_rows(self) -> int:
        return self.megatron_config.global_batch_size * self.rl_config.n_samples_per_prompt

    def _dispatch(self, size) -> int:
        """Rows per request: the config value (filled by validate_rl_args),
        else this rank's share of the batch."""
        return size or self._total_rows() // self.parallel_state.dp_size

    def _requests_per_rank(self, rows_per_request: int) -> int:
        """Each rank takes its own part of the plan's shares (no rank takes a
        second share while another waits for its first)."""
        shares = -(-self._total_rows() // rows_per_request)
        return -(-shares // self.parallel_state.dp_size)

    def update(self, kl_coef: float, skip_actor_log_prob: bool) -> Dict[str, float]:
        """GRPO update: this rank's mini-batches (balanced shares from the dock),
        ``epochs`` passes, one optimizer step per mini-batch."""
        start = time.perf_counter()
        rl, ps = self.rl_config, self.parallel_state
        total = self._total_rows()
        per_rank = rl.mini_batch_size // ps.dp_size
        columns = SEQ_COLUMNS + ["advantages"] + ([] if skip_actor_log_prob else ["old_log_prob"])
        columns += ["ref_log_prob"] if self.ref is not None else []
        batches = [b for b, _ in self.iterate_stage("actor_train", columns, per_rank,
                                                   max_batches=total // rl.mini_batch_size)]
        metrics, tokens = [], 0
        for _ in range(rl.epochs):
            for batch in batches:
                metrics.append(self._train_mini_batch(batch, kl_coef, skip_actor_log_prob))
                tokens += sum(_lengths(batch))
        out = {k: float(np.mean([m[k] for m in metrics])) for k in metrics[0]} if metrics else {}
        out.update(self._timing("update", start, tokens))
        return out

    def _train_mini_batch(self, batch, kl_coef, skip_actor_log_prob) -> Dict[str, float]:
        rl = self.rl_config
        local_tokens = sum(r.numel() for r in batch["responses"])
        token_count = all_reduce_scalar(float(local_tokens), "sum", self.parallel_state.dp_group)
        parts = self._micro_batches(_lengths(batch), self.megatron_config.micro_batch_size, sync=True)
        advantages = torch.cat([a.reshape(1).float() for a in batch["advantages"]])

        def padded(column, idx):
            return pad_sequence([batch[column][i].float() for i in idx], batch_first=True)

        def loss_fn(idx, log_probs, entropy):
            lp = pad_sequence(log_probs, batch_first=True)
            mask = pad_sequence([torch.ones_like(x) for x in log_probs], batch_first=True)
            old = lp.detach() if skip_actor_log_prob else padded("old_log_prob", idx).to(lp.device)
            ref = padded("ref_log_prob", idx).to(lp.device) if self.ref is not None else None
            ent = pad_sequence(entropy, batch_first=True) if entropy is not None else None
            return grpo_loss(lp, old, advantages[idx].to(lp.device), mask, clip_ratio=rl.clip_ratio,
                             ref_log_probs=ref, kl_coef=kl_coef, kl_kind=rl.kl_penalty, entropy=ent,
                             entropy_coeff=rl.entropy_coeff, token_count=1.0)

        return self.actor.train_step(batch["prompts"], batch["responses"], parts, loss_fn, token_count,
                                     dp_size=self.parallel_state.dp_size, with_entropy=rl.entropy_coeff > 0,
                                     temperature=self._temperature())

    # ------------------------------------------------------------ misc

    def _temperature(self) -> float:
        """Log-probs use the sampling temperature, so ratios compare like with like."""
        temperature = self.generate_config.sampling_config["temperature"]
        return float(temperature) if temperature and temperature > 0 else 1.0

    def _timing(self, stage: str, start: float, tokens: int = 0) -> Dict[str, float]:
        return {f"timing/{stage}": time.perf_counter() - start, f"tokens/{stage}": float(tokens),
                "rank": float(self.rank)}

    def save_checkpoint(self, path: str):
        if self.rank == 0:
            self.actor.save(path)
        return path
