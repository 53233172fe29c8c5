"""Actor, reference and rollout in one worker (upstream's integrated mode)."""
import time
from typing import Dict

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from mindspeed_rl.plan.stages import (IS_WEIGHTS, LOSS_MASK, OLD, REF, RESPONSE_MASK, ROLLOUT,
                                           ROLLOUT_BUDGET, ROLLOUT_LOG_PROBS, TOOL_CALLS, TRAIN, TURN_STATE)
from mindspeed_rl.algorithms.policy_loss import actor_loss
from mindspeed_rl.models.causal_lm import CausalLMEngine
from mindspeed_rl.models.rollout import make_backend
from mindspeed_rl.models.rollout.drift import rollout_drift
from mindspeed_rl.models.rollout.results import Served
from mindspeed_rl.balance.rollout_queue import LocalSource, RolloutQueue
from mindspeed_rl.agent.conversation import turn_state_row
from mindspeed_rl.agent.metrics import turn_counts
from mindspeed_rl.utils.checkpoint import DCP_DIR, RNG_DIR
from mindspeed_rl.utils.error_cause import named_failure
from mindspeed_rl.workers.engine_worker import EngineWorker, sequence_lengths as _lengths


def _length_rows(responses):
    """``response_length`` rows of ``responses`` (one int32 count each)."""
    return [torch.tensor([r.numel()], dtype=torch.int32) for r in responses]


def budgets(batch):
    """Each row's new-token budget of this pass (partial rollout's ``rollout_budget`` column), or None."""
    return [int(b) for b in batch[ROLLOUT_BUDGET]] if ROLLOUT_BUDGET in batch else None


def rollout_seed(base: int, iteration: int, first_row: int) -> int:
    """Sampling seed of a rollout share: distinct for every (seed, iteration, row)."""
    words = np.random.SeedSequence([int(base) % 2 ** 63, int(iteration), int(first_row)]).generate_state(2)
    return (int(words[0]) << 31 | int(words[1]) >> 1) % 2 ** 63


class IntegratedWorker(EngineWorker):
    def initialize(self, model_path: str, eos_id: int, pad_id: int):
        common = self._engine_kwargs(pad_id)
        # actor: fp32 master weights, bf16 compute; reference: frozen bf16 weights, sharded like the actor
        self.actor = CausalLMEngine(model_path, **self._trainable_kwargs(), **common)
        self.ref = CausalLMEngine(model_path, trainable=False, dtype=self._half() or torch.float32,
                                  **common) if self.run_plan.uses_reference else None
        self.eos_id, self.pad_id = eos_id, pad_id
        self.rollout = self._rollout_backend(model_path)
        return self.rank

    def _rollout_backend(self, model_path: str):
        """The rollout backend over ``self.actor`` (multi-turn: with its agent loop, the tools beside the engine)."""
        rollout = make_backend(self.run_plan.worker.rollout, self.actor, model_path, self.device, self.rank,
                               self.world_size, seed=self.run_plan.seed,
                               trust_remote_code=self.run_plan.worker.engine.trust_remote_code)
        if self.run_plan.multi_turn is not None:
            from mindspeed_rl.agent.build import build_agent
            rollout.agent = build_agent(self.run_plan.multi_turn, self.run_plan.worker.sampling.max_tokens,
                                        model_path)
        return rollout

    # ------------------------------------------------------------ stages
    # Each takes this rank's rows, one column dict per share, and returns
    # (metrics, output columns) (see BaseWorker.run_stage).

    def _seed_of(self, iteration: int):
        """Row r's sampling seed in ``iteration``: (seed, iteration, r) only, whichever rank makes the row."""
        sampling = self.run_plan.worker.sampling
        base = sampling.seed if sampling.seed is not None else self.run_plan.seed
        return lambda row: rollout_seed(base, iteration, row)

    def generate_sequences(self, batches, shares, iteration: int = 0, **_):
        """Rollout of this rank's fixed shares (``rl_config.rollout_balance: static``). The HF backend seeds a share
        by its first row, vLLM every row by its own seed, so runs repeat and resume exactly."""
        start = time.perf_counter()
        seed_of, sampling = self._seed_of(iteration), self.run_plan.worker.sampling
        if getattr(self.rollout, "agent", None) is not None:  # multi-turn: each share's conversations, in the share's row order
            return self._conversations_of_shares(batches, shares, seed_of, start)
        lengths, out = [], {"responses": [], "response_length": []}
        drift = self.run_plan.worker.rollout.returns_log_probs
        if drift:
            out[ROLLOUT_LOG_PROBS] = []
        for batch, share in zip(batches, shares):
            result = self.rollout.generate(batch["prompts"], sampling, [seed_of(row) for row in share],
                                           eos_id=self.eos_id, pad_id=self.pad_id, budgets=budgets(batch))
            out["responses"] += result.responses
            if drift:
                out[ROLLOUT_LOG_PROBS] += result.log_probs
            lengths += [p.numel() + r.numel() for p, r in zip(batch["prompts"], result.responses)]
        out["response_length"] = _length_rows(out["responses"])
        return self._timing(ROLLOUT.name, start, lengths), out

    def _conversations_of_shares(self, batches, shares, seed_of, start):
        """Multi-turn rollout of fixed shares: each share through the serve path over a queue of its own rows
        (pure bookkeeping in this process), put back in the share's order."""
        parts = []
        for batch, share in zip(batches, shares):
            queue = RolloutQueue()
            queue.load(("share", int(share[0])), len(share), 1, cap=self.run_plan.worker.rollout.max_num_seqs)
            source = LocalSource(queue, 0, list(share), {c: batch[c] for c in ("prompts", "labels") if c in batch})
            parts.append(self.rollout.serve(source, self.run_plan.worker.sampling, seed_of, self.eos_id,
                                            self.pad_id, len(share)))
        served = Served.joined(parts).ordered([int(r) for share in shares for r in share])
        out, lengths = self._served_columns(served)
        metrics = self._timing(ROLLOUT.name, start, lengths)
        metrics.update(turn_counts(served))
        return metrics, out

    def _served_columns(self, served):
        """(output columns, each row's prompt + response tokens) of what an engine served."""
        out = {"responses": served.responses, "response_length": _length_rows(served.responses)}
        if self.run_plan.worker.rollout.returns_log_probs:
            if served.log_probs is None and served.responses:
                raise RuntimeError(f"rank {self.rank}: the rollout backend made {len(served.responses)} rows without "
                                   f"the log-probs this run needs")
            out[ROLLOUT_LOG_PROBS] = served.log_probs or []  # an engine that served no row (a short pass) has none
        if served.masks is not None:  # multi-turn: tool tokens leave the loss; each row's tool rounds
            out[LOSS_MASK] = served.masks
            out[TOOL_CALLS] = [torch.tensor([s["tool_rounds"]], dtype=torch.int32) for s in served.turn_stats]
        if self.run_plan.features.carried_turns:  # partial rollout: whether each pass cut its conversation
            out[TURN_STATE] = [turn_state_row(s) for s in served.turn_stats]
        return out, [p + r.numel() for p, r in zip(served.prompt_lengths, served.responses)]

    def serve_sequences(self, source, iteration: int = 0, **_):
        """Rollout from the round's queue (``source``: this consumer's end of it) until it is drained.
        Returns (metrics, output columns in the order the rows finished, the consumer's trace: its row ids,
        busy seconds, row latencies and engine records for the driver's balance figures)."""
        start, began = time.perf_counter(), time.time()
        self.rollout.prepare()  # every rank together: the weight gather is a collective
        synced = time.perf_counter()
        stage = self.run_plan.stages[ROLLOUT.name]
        served = self.rollout.serve(source, self.run_plan.worker.sampling, self._seed_of(iteration),
                                    self.eos_id, self.pad_id, stage.rows_per_share)
        out, lengths = self._served_columns(served)
        metrics = self._timing(ROLLOUT.name, start, lengths, load=False)
        if served.masks is not None:
            metrics.update(turn_counts(served))
        metrics["timing/rollout_weight_sync"] = synced - start
        trace = {"rows": served.rows, "busy": served.busy, "latency": served.latency,
                 "trace": served.trace_array(), "span": (began, time.time())}  # wall clock: the async timeline
        if served.masks is not None:  # multi-turn: seconds its rows waited on tools, those the engine stepped
            trace["tools"] = [served.tool_running, served.tool_busy]
        return metrics, out, trace

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
        metrics = []
        for _ in range(plan.epochs):
            for batch in batches:
                metrics.append(self._train_mini_batch(batch, kl_coef))
        out = {k: float(np.mean([m[k] for m in metrics])) for k in metrics[0]} if metrics else {}
        out.update(self._timing(TRAIN.name, start, [n for b in batches for n in _lengths(b)]))
        self.rollout.weights_changed()  # the next rollout samples from the updated policy
        return out, None

    def _train_mini_batch(self, batch, kl_coef) -> Dict[str, float]:
        rl = self.run_plan.worker.loss
        # no old log-probs stage (on-policy, the plan's one decision): this pass's own log-probs are the old ones
        own_old = not self.run_plan.computes_old_log_prob
        # the loss divides by the mini-batch's tokens or sequences (loss_agg_mode), over all DP ranks
        kept = ([int(m.sum()) for m in batch[RESPONSE_MASK]] if RESPONSE_MASK in batch  # rejected tokens are out
                else [int(m.sum()) for m in batch[LOSS_MASK]] if LOSS_MASK in batch  # tool tokens are out
                else [r.numel() for r in batch["responses"]])
        bypass = self.run_plan.features.bypass

        def loss_fn(idx, log_probs, entropy):
            lp = pad_sequence(log_probs, batch_first=True)
            mask = batch.masked("responses", idx)[1].to(lp)  # True on each row's response tokens
            # per token (every estimator of the plan); one per row, as upstream's dock adapters write them, broadcasts
            advantages = batch.padded("advantages", idx)
            if RESPONSE_MASK in batch:
                mask = mask * batch.padded(RESPONSE_MASK, idx).to(mask)
            if LOSS_MASK in batch:
                mask = mask * batch.padded(LOSS_MASK, idx).to(mask)
            if bypass:  # rollout correction's bypass mode: the engine's log-probs are the old ones
                old = batch.padded(ROLLOUT_LOG_PROBS, idx).to(lp)
            else:
                old = lp.detach() if own_old else batch.padded(OLD.outputs[0], idx).to(lp.device)
            weights = batch.padded(IS_WEIGHTS, idx).to(lp) if IS_WEIGHTS in batch else None
            ref = batch.padded(REF.outputs[0], idx).to(lp.device) if self.ref is not None else None
            ent = pad_sequence(entropy, batch_first=True) if entropy is not None else None
            return actor_loss(lp, old, advantages.to(lp.device), mask, clip_ratio=rl.clip_ratio,
                              ref_log_probs=ref, kl_coef=kl_coef, kl_kind=rl.kl_penalty, entropy=ent,
                              entropy_coeff=rl.entropy_coeff, token_count=1.0, clip_ratio_low=rl.clip_ratio_low,
                              clip_ratio_high=rl.clip_ratio_high, is_weights=weights, loss_mode=rl.loss_mode,
                              loss_agg_mode=rl.agg_mode)  # the denominator (token_count 1) is the step's

        drift = ROLLOUT_LOG_PROBS in batch
        trainer_lp = {}  # on-policy: this pass's own log-probs are the trainer's view of the rollout policy

        def tracked_loss_fn(idx, log_probs, entropy):
            trainer_lp.update(zip(idx, (lp.detach().float().cpu() for lp in log_probs)))
            return loss_fn(idx, log_probs, entropy)

        fn = tracked_loss_fn if drift and own_old else loss_fn
        metrics = self._mini_batch_step(self.actor, batch, kept, fn, TRAIN.micro_batch_key, rl.agg_mode,
                                        with_entropy=rl.entropy_coeff > 0, temperature=self._temperature())
        if drift:
            trainer = ([trainer_lp[i] for i in range(len(batch["responses"]))] if own_old
                       else [t.float() for t in batch[OLD.outputs[0]]])
            metrics.update(rollout_drift(batch[ROLLOUT_LOG_PROBS], trainer))
        return metrics

    # ------------------------------------------------------------ misc

    def _temperature(self) -> float:
        """Log-probs use the sampling temperature, so ratios compare like with like."""
        return self.run_plan.worker.sampling.log_prob_temperature

    # ------------------------------------------------------------ checkpoints

    def save_checkpoint(self, folder: str, with_optimizer: bool = True, with_rng: bool = True) -> str:
        """Sharded actor state (every rank writes its shards) and this rank's RNG state."""
        self._save_engine(self.actor, folder, DCP_DIR, RNG_DIR, with_optimizer, with_rng)
        return folder

    def load_checkpoint(self, folder: str, iteration: int, with_optimizer: bool = True,
                        with_rng: bool = True) -> int:
        """Actor state of ``folder``; the LR schedule resumes after ``iteration``'s steps."""
        self._load_engine(self.actor, folder, DCP_DIR, RNG_DIR, iteration, with_optimizer, with_rng)
        self.rollout.weights_changed()
        return iteration

    def policy_state(self):
        """The actor's full state dict for the async modes' rollout engines (every rank calls it: a gather of
        sharded weights is a collective); rank 0 returns it, the others None."""
        state = self.actor.state_dict_for_save()
        return {k: v.detach().to("cpu", copy=True) for k, v in state.items()} if self.rank == 0 else None

    def shutdown(self):
        rollout = getattr(self, "rollout", None)
        if rollout is not None:
            rollout.close()
        super().shutdown()

    def export_hf(self, path: str) -> str:
        """HF ``save_pretrained`` of the gathered actor (every rank gathers; global rank 0 writes)."""
        with named_failure("exporting HF weights into", path):
            self.actor.save(path)
        return path
