"""Actor, reference and rollout in one worker (upstream's integrated mode)."""
import functools
import importlib.util
import os
import time
from typing import Dict, List

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from mindspeed_rl.config_cls.stages import OLD, REF, ROLLOUT, ROLLOUT_LOG_PROBS, TRAIN
from mindspeed_rl.models.causal_lm import CausalLMEngine
from mindspeed_rl.models.loss.grpo_loss import grpo_loss
from mindspeed_rl.models.lr_schedule import lr_at
from mindspeed_rl.models.rollout import make_backend
from mindspeed_rl.models.rollout.drift import rollout_drift
from mindspeed_rl.utils.checkpoint import DCP_DIR, CheckpointError, capture_rng, restore_rng
from mindspeed_rl.utils.dist_sync import all_reduce_scalar, sync_micro_batch_count
from mindspeed_rl.utils.seqlen_balancing import rearrange_micro_batches
from mindspeed_rl.utils.utils import seed_all
from mindspeed_rl.workers.base_worker import BaseWorker

def _lengths(batch) -> List[int]:
    return [int(p) + int(r) for p, r in zip(batch["prompt_length"], batch["response_length"])]


def rollout_seed(base: int, iteration: int, first_row: int) -> int:
    """Sampling seed of a rollout share: distinct for every (seed, iteration, row)."""
    words = np.random.SeedSequence([int(base) % 2 ** 63, int(iteration), int(first_row)]).generate_state(2)
    return (int(words[0]) << 31 | int(words[1]) >> 1) % 2 ** 63


class IntegratedWorker(BaseWorker):
    def initialize(self, model_path: str, eos_id: int, pad_id: int):
        engine, opt = self.run_plan.worker.engine, self.run_plan.worker.optimizer
        seed_all(engine.seed + self.rank, deterministic=False)  # this rank's global streams (megatron_training.seed)
        half = torch.bfloat16 if engine.bf16 and self.device.type != "cpu" else None
        layout = self.run_plan.layout
        common = dict(device=self.device, use_remove_padding=engine.use_remove_padding, seed=self.run_plan.seed,
                      pad_id=pad_id, attn_implementation=self._attention(),
                      trust_remote_code=engine.trust_remote_code,
                      mesh=self.parallel_state.mesh, fsdp=layout.engine == "fsdp")
        # actor: fp32 master weights, bf16 compute; reference: frozen bf16 weights, sharded like the actor
        self.actor = CausalLMEngine(model_path, trainable=True, lr=opt.lr, weight_decay=opt.weight_decay,
                                    betas=opt.betas, eps=opt.eps, clip_grad=opt.clip_grad,
                                    process_group=self.parallel_state.dp_group, dtype=torch.float32,
                                    autocast_dtype=half, lr_schedule=self._lr_schedule(), **common)
        self.ref = CausalLMEngine(model_path, trainable=False, dtype=half or torch.float32,
                                  **common) if self.run_plan.uses_reference else None
        self.eos_id, self.pad_id = eos_id, pad_id
        self.rollout = make_backend(self.run_plan.worker.rollout, self.actor, model_path, self.device, self.rank,
                                    self.world_size, seed=self.run_plan.seed,
                                    trust_remote_code=engine.trust_remote_code)
        return self.rank

    def _lr_schedule(self):
        """Per optimizer step, over the run plan's optimizer steps."""
        opt = self.run_plan.worker.optimizer
        total = self.run_plan.optimizer_steps
        warmup = int(opt.lr_warmup_fraction * total)
        return functools.partial(lr_at, base_lr=opt.lr, min_lr=opt.min_lr, total_steps=total,
                                 warmup_steps=warmup, style=opt.lr_decay_style)

    def _attention(self):
        """flash_attention_2 on CUDA when asked for (use_flash_attn) and installed; else the HF default."""
        if not (self.run_plan.worker.engine.use_flash_attn and self.device.type == "cuda"):
            return None
        return "flash_attention_2" if importlib.util.find_spec("flash_attn") else None

    # ------------------------------------------------------------ micro-batches

    def _micro_batches(self, lengths: List[int], fixed_size, sync: bool) -> List[List[int]]:
        """Index lists per micro-batch: token-capped (dynamic batch size) or
        fixed-size; with ``sync`` every DP rank gets the same count."""
        n = len(lengths)
        spec = self.run_plan.worker.micro_batches
        if spec.use_dynamic_bsz:
            parts = rearrange_micro_batches(lengths, spec.max_packing_token_size)
            if sync:
                count = sync_micro_batch_count(len(parts), self.parallel_state.dp_group)
                if count > len(parts):
                    parts = rearrange_micro_batches(lengths, spec.max_packing_token_size,
                                                    min_num_micro_batches=count)
            return parts
        size = max(1, fixed_size or n)
        count = -(-n // size)
        if sync:
            count = sync_micro_batch_count(count, self.parallel_state.dp_group)
        return [chunk.tolist() for chunk in np.array_split(np.arange(n), count)]

    # ------------------------------------------------------------ stages
    # Each takes this rank's rows, one column dict per share, and returns
    # (metrics, output columns) (see BaseWorker.run_stage).

    def generate_sequences(self, batches, shares, iteration: int = 0, **_):
        """Rollout of this rank's shares. Row r's sampling seed depends on (seed, iteration, r) only (the HF
        backend seeds a share by its first row), so runs repeat and resume exactly."""
        start = time.perf_counter()
        sampling = self.run_plan.worker.sampling
        base = sampling.seed if sampling.seed is not None else self.run_plan.seed
        lengths, out = [], {"responses": [], "response_length": []}
        drift = self.run_plan.worker.rollout.returns_log_probs
        if drift:
            out[ROLLOUT_LOG_PROBS] = []
        for batch, share in zip(batches, shares):
            result = self.rollout.generate(batch["prompts"], sampling,
                                           [rollout_seed(base, iteration, row) for row in share],
                                           eos_id=self.eos_id, pad_id=self.pad_id)
            out["responses"] += result.responses
            out["response_length"] += [torch.tensor([r.numel()], dtype=torch.int32) for r in result.responses]
            if drift:
                out[ROLLOUT_LOG_PROBS] += result.log_probs
            lengths += [p.numel() + r.numel() for p, r in zip(batch["prompts"], result.responses)]
        return self._timing(ROLLOUT.name, start, lengths), out

    def _log_prob_stage(self, stage, batches, engine):
        start = time.perf_counter()
        forward_mbs = self.run_plan.worker.micro_batches.size(stage.stage.micro_batch_key)
        lengths_seen, out = [], []
        for batch in batches:
            lengths = _lengths(batch)
            lengths_seen += lengths
            parts = self._micro_batches(lengths, forward_mbs, sync=False)
            log_probs, _ = engine.log_probs(batch["prompts"], batch["responses"], parts,
                                            temperature=self._temperature())
            out += log_probs
        return self._timing(stage.name, start, lengths_seen), {stage.outputs[0]: out}

    def compute_ref_log_prob(self, batches, shares=None, **_):
        return self._log_prob_stage(self.run_plan.stages[REF.name], batches, self.ref)

    def compute_log_prob(self, batches, shares=None, **_):
        return self._log_prob_stage(self.run_plan.stages[OLD.name], batches, self.actor)

    def update(self, batches, shares=None, kl_coef: float = 0.0, **_):
        """GRPO update: this rank's shares of the round (one per mini-batch,
        balanced by the dock), ``epochs`` passes, one optimizer step per mini-batch."""
        start = time.perf_counter()
        plan = self.run_plan
        on_policy = not plan.computes_old_log_prob
        metrics = []
        for _ in range(plan.epochs):
            for batch in batches:
                metrics.append(self._train_mini_batch(batch, kl_coef, on_policy))
        out = {k: float(np.mean([m[k] for m in metrics])) for k in metrics[0]} if metrics else {}
        out.update(self._timing(TRAIN.name, start, [n for b in batches for n in _lengths(b)]))
        self.rollout.weights_changed()  # the next rollout samples from the updated policy
        return out, None

    def _train_mini_batch(self, batch, kl_coef, skip_actor_log_prob) -> Dict[str, float]:
        rl = self.run_plan.worker.loss
        # the loss divides by the mini-batch's tokens (token_level_loss) or sequences, over all DP ranks
        local = sum(r.numel() for r in batch["responses"]) if rl.token_level_loss else len(batch["responses"])
        token_count = all_reduce_scalar(float(local), "sum", self.parallel_state.dp_group)
        parts = self._micro_batches(_lengths(batch), self.run_plan.worker.micro_batches.size(TRAIN.micro_batch_key),
                                    sync=True)
        advantages = torch.cat([a.reshape(1).float() for a in batch["advantages"]])

        def padded(column, idx):
            return pad_sequence([batch[column][i].float() for i in idx], batch_first=True)

        def loss_fn(idx, log_probs, entropy):
            lp = pad_sequence(log_probs, batch_first=True)
            mask = pad_sequence([torch.ones_like(x) for x in log_probs], batch_first=True)
            old = lp.detach() if skip_actor_log_prob else padded(OLD.outputs[0], idx).to(lp.device)
            ref = padded(REF.outputs[0], idx).to(lp.device) if self.ref is not None else None
            ent = pad_sequence(entropy, batch_first=True) if entropy is not None else None
            return grpo_loss(lp, old, advantages[idx].to(lp.device), mask, clip_ratio=rl.clip_ratio,
                             ref_log_probs=ref, kl_coef=kl_coef, kl_kind=rl.kl_penalty, entropy=ent,
                             entropy_coeff=rl.entropy_coeff, token_count=1.0, clip_ratio_low=rl.clip_ratio_low,
                             clip_ratio_high=rl.clip_ratio_high, token_level_loss=rl.token_level_loss)

        drift = ROLLOUT_LOG_PROBS in batch
        trainer_lp = {}  # on-policy: this pass's own log-probs are the trainer's view of the rollout policy

        def tracked_loss_fn(idx, log_probs, entropy):
            trainer_lp.update(zip(idx, (lp.detach().float().cpu() for lp in log_probs)))
            return loss_fn(idx, log_probs, entropy)

        fn = tracked_loss_fn if drift and skip_actor_log_prob else loss_fn
        metrics = self.actor.train_step(batch["prompts"], batch["responses"], parts, fn, token_count,
                                        dp_size=self.parallel_state.dp_size, with_entropy=rl.entropy_coeff > 0,
                                        temperature=self._temperature())
        if drift:
            trainer = ([trainer_lp[i] for i in range(len(batch["responses"]))] if skip_actor_log_prob
                       else [t.float() for t in batch[OLD.outputs[0]]])
            metrics.update(rollout_drift(batch[ROLLOUT_LOG_PROBS], trainer))
        return metrics

    # ------------------------------------------------------------ misc

    def _temperature(self) -> float:
        """Log-probs use the sampling temperature, so ratios compare like with like."""
        return self.run_plan.worker.sampling.log_prob_temperature

    def _timing(self, stage: str, start: float, lengths: List[int] = ()) -> Dict[str, float]:
        """Stage time, tokens and workload (the balance objective) this rank processed."""
        out = {f"timing/{stage}": time.perf_counter() - start, f"tokens/{stage}": float(sum(lengths)),
               "rank": float(self.rank), "dp_rank": float(self.parallel_state.dp_rank),
               "tp_rank": float(self.parallel_state.tp_rank)}
        spec = self.run_plan.balance
        if spec is not None and spec.objective == "flops":
            load = float(spec.workload.cost(np.asarray(lengths, dtype=np.float64)).sum())
        else:
            load = float(sum(lengths))
        out[f"load/{stage}"] = load
        if self.device.type == "cuda":
            out[f"memory/{stage}_peak_gb"] = torch.cuda.max_memory_allocated(self.device) / 2 ** 30
        return out

    # ------------------------------------------------------------ checkpoints

    def save_checkpoint(self, folder: str, with_optimizer: bool = True, with_rng: bool = True) -> str:
        """Sharded actor state (every rank writes its shards) and this rank's RNG state."""
        self.actor.save_sharded(os.path.join(folder, DCP_DIR), with_optimizer)
        if with_rng:
            os.makedirs(os.path.join(folder, "rng"), exist_ok=True)
            torch.save(capture_rng(self.device), os.path.join(folder, "rng", f"rank{self.rank}.pt"))
        return folder

    def load_checkpoint(self, folder: str, iteration: int, with_optimizer: bool = True,
                        with_rng: bool = True) -> int:
        """Actor state of ``folder``; the LR schedule resumes after ``iteration``'s steps."""
        from torch.distributed.checkpoint.api import CheckpointException
        try:
            self.actor.load_sharded(os.path.join(folder, DCP_DIR), with_optimizer)
        except (Exception, CheckpointException) as err:  # (DCP's error is a BaseException) truncated or foreign files
            raise CheckpointError(f"checkpoint {folder!r} could not be read: {type(err).__name__}: {err}") from err
        self.actor.set_step(iteration * self.run_plan.steps_per_iteration)
        self.rollout.weights_changed()
        if with_rng:
            path = os.path.join(folder, "rng", f"rank{self.rank}.pt")
            if not os.path.isfile(path):
                raise CheckpointError(f"checkpoint {folder!r} has no RNG state for rank {self.rank} ({path}); "
                                      f"set no_load_rng: true to start fresh random streams")
            restore_rng(torch.load(path, weights_only=False), self.device)
        return iteration

    def shutdown(self):
        rollout = getattr(self, "rollout", None)
        if rollout is not None:
            rollout.close()
        super().shutdown()

    def export_hf(self, path: str) -> str:
        """HF ``save_pretrained`` of the gathered actor (every rank gathers; global rank 0 writes)."""
        self.actor.save(path)
        return path
