"""What every worker that holds a training engine shares: engine set-up from the
worker spec, micro-batches, per-stage timing and load, sharded checkpoints."""
import functools
import importlib.util
import os
import time
from typing import Dict, List

import numpy as np
import torch

from mindspeed_rl.algorithms.aggregation import denominator
from mindspeed_rl.models.lr_schedule import lr_at
from mindspeed_rl.utils.checkpoint import CheckpointError, capture_rng, restore_rng
from mindspeed_rl.utils.dist_sync import all_reduce_scalar, sync_micro_batch_count
from mindspeed_rl.utils.error_cause import failure_text, named_failure
from mindspeed_rl.balance.seqlen_balancing import rearrange_micro_batches
from mindspeed_rl.utils.utils import seed_all
from mindspeed_rl.workers.base_worker import BaseWorker


def sequence_lengths(batch) -> List[int]:
    """prompt + response tokens of each row of a stage batch."""
    return [int(p) + int(r) for p, r in zip(batch["prompt_length"], batch["response_length"])]


class EngineWorker(BaseWorker):
    # ------------------------------------------------------------ engines

    def _half(self):
        """bf16 compute on an accelerator when the config asks for it (CPU stays fp32)."""
        return torch.bfloat16 if self.run_plan.worker.engine.bf16 and self.device.type != "cpu" else None

    def _engine_kwargs(self, pad_id: int) -> dict:
        """Seeds this rank's global streams (megatron_training.seed + rank); the keywords every engine takes."""
        engine = self.run_plan.worker.engine
        seed_all(engine.seed + self.rank, deterministic=False)
        return dict(device=self.device, use_remove_padding=engine.use_remove_padding, seed=self.run_plan.seed,
                    pad_id=pad_id, attn_implementation=self._attention(), trust_remote_code=engine.trust_remote_code,
                    mesh=self.parallel_state.mesh, fsdp=self.run_plan.layout.engine == "fsdp")

    def _trainable_kwargs(self) -> dict:
        """A trained engine: fp32 master weights, bf16 compute, AdamW of the worker spec, the LR schedule."""
        opt = self.run_plan.worker.optimizer
        return dict(trainable=True, lr=opt.lr, weight_decay=opt.weight_decay, betas=opt.betas, eps=opt.eps,
                    clip_grad=opt.clip_grad, process_group=self.parallel_state.dp_group, dtype=torch.float32,
                    autocast_dtype=self._half(), lr_schedule=self._lr_schedule())

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

    def _mini_batch_step(self, engine, batch, kept: List[float], loss_fn, micro_batch_key: str, agg_mode: str,
                         **kwargs) -> Dict[str, float]:
        """One optimizer step over this rank's share of a mini-batch, the actor's and the critic's alike: the
        ``agg_mode`` denominator over every DP rank (``kept``: each row's tokens in the loss), micro-batches as
        many on every rank, the engine's step (``loss_fn(idx, outputs, entropy)`` -> (summed loss, metrics))."""
        local = denominator(kept, agg_mode, self.run_plan.worker.loss.horizon)
        count = all_reduce_scalar(float(local), "sum", self.parallel_state.dp_group)
        parts = self._micro_batches(sequence_lengths(batch), self.run_plan.worker.micro_batches.size(micro_batch_key),
                                    sync=True)
        return engine.train_step(batch["prompts"], batch["responses"], parts, loss_fn, count,
                                 dp_size=self.parallel_state.dp_size, **kwargs)

    def _timing(self, stage: str, start: float, lengths: List[int] = (), load: bool = True) -> Dict[str, float]:
        """Stage time, tokens and workload (the balance objective) this rank processed (``load``: the
        workload too, for the DP-balance figures of a planned stage; a queued stage has its own)."""
        out = {f"timing/{stage}": time.perf_counter() - start, f"tokens/{stage}": float(sum(lengths)),
               "rank": float(self.rank), "dp_rank": float(self.parallel_state.dp_rank),
               "tp_rank": float(self.parallel_state.tp_rank)}
        spec = self.run_plan.balance
        if load and spec is not None and spec.objective == "flops":
            out[f"load/{stage}"] = float(spec.workload.cost(np.asarray(lengths, dtype=np.float64)).sum())
        elif load:
            out[f"load/{stage}"] = float(sum(lengths))
        if self.device.type == "cuda":
            out[f"memory/{stage}_peak_gb"] = torch.cuda.max_memory_allocated(self.device) / 2 ** 30
        return out

    # ------------------------------------------------------------ checkpoints

    def _save_engine(self, engine, folder: str, dcp_dir: str, rng_dir: str, with_optimizer: bool, with_rng: bool):
        """Sharded engine state (every rank writes its shards) and this rank's RNG state."""
        with named_failure("saving checkpoint into", folder, CheckpointError):  # one line: the cause
            engine.save_sharded(os.path.join(folder, dcp_dir), with_optimizer)
            if with_rng:
                os.makedirs(os.path.join(folder, rng_dir), exist_ok=True)
                torch.save(capture_rng(self.device), os.path.join(folder, rng_dir, f"rank{self.rank}.pt"))

    def _load_engine(self, engine, folder: str, dcp_dir: str, rng_dir: str, iteration: int, with_optimizer: bool,
                     with_rng: bool):
        """What ``_save_engine`` wrote; the LR schedule resumes after ``iteration``'s steps."""
        from torch.distributed.checkpoint.api import CheckpointException
        path = os.path.join(folder, dcp_dir)
        if not os.path.isdir(path):
            raise CheckpointError(f"checkpoint {folder!r} has no {dcp_dir} folder (saved by another kind of run?)")
        try:
            engine.load_sharded(path, with_optimizer)
        except (Exception, CheckpointException) as err:  # (DCP's error is a BaseException) truncated or foreign files
            raise CheckpointError(f"checkpoint {folder!r} could not be read: {failure_text(folder, err)}") from err
        engine.set_step(iteration * self.run_plan.steps_per_iteration)
        if with_rng:
            rng = os.path.join(folder, rng_dir, f"rank{self.rank}.pt")
            if not os.path.isfile(rng):
                raise CheckpointError(f"checkpoint {folder!r} has no RNG state for rank {self.rank} ({rng}); "
                                      f"set no_load_rng: true to start fresh random streams")
            restore_rng(torch.load(rng, weights_only=False), self.device)
