"""PPO's critic: a value head on the policy's transformers family, on its own worker group
(critic_config on rl_config.critic_resource). Stages: ``critic_compute_values`` and ``critic_train``."""
import time
from typing import Dict

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from mindspeed_rl.plan.stages import CRITIC_TRAIN, LOSS_MASK, VALUES
from mindspeed_rl.models.causal_lm import CausalLMEngine
from mindspeed_rl.models.loss.value_loss import value_loss
from mindspeed_rl.utils.checkpoint import CRITIC_DCP_DIR, CRITIC_RNG_DIR
from mindspeed_rl.workers.engine_worker import EngineWorker, sequence_lengths


class CriticWorker(EngineWorker):
    def initialize(self, model_path: str, eos_id: int, pad_id: int):
        self.critic = CausalLMEngine(model_path, head="value", metrics_prefix="critic", **self._trainable_kwargs(),
                                     **self._engine_kwargs(pad_id))
        return self.rank

    def compute_values(self, batches, shares=None, **_):
        """The value of every response token (the state before it) of this rank's shares."""
        start = time.perf_counter()
        size = self.run_plan.worker.micro_batches.size(VALUES.micro_batch_key)
        seen, out = [], []
        for batch in batches:
            lengths = sequence_lengths(batch)
            seen += lengths
            out += self.critic.values(batch["prompts"], batch["responses"],
                                      self._micro_batches(lengths, size, sync=False))
        return self._timing(VALUES.name, start, seen), {VALUES.outputs[0]: out}

    def update(self, batches, shares=None, **_):
        """Clipped value loss towards the GAE returns: ``epochs`` passes, one optimizer step per share."""
        start = time.perf_counter()
        metrics = [self._train_mini_batch(batch) for _ in range(self.run_plan.epochs) for batch in batches]
        out = {k: float(np.mean([m[k] for m in metrics])) for k in metrics[0]} if metrics else {}
        out.update(self._timing(CRITIC_TRAIN.name, start, [n for b in batches for n in sequence_lengths(b)]))
        return out, None

    def _train_mini_batch(self, batch) -> Dict[str, float]:
        spec = self.run_plan.worker
        token_level = spec.loss.agg_mode == "token-mean"  # else one weight per sequence

        def loss_fn(idx, vpreds, _):
            pred = pad_sequence(vpreds, batch_first=True)
            mask = pad_sequence([torch.ones_like(v) for v in vpreds], batch_first=True)
            if LOSS_MASK in batch:  # multi-turn: the value loss is on the model's tokens
                mask = mask * batch.padded(LOSS_MASK, idx).to(mask)
            return value_loss(pred, batch.padded("values", idx).to(pred.device),
                              batch.padded("returns", idx).to(pred.device), mask,
                              spec.loss.cliprange_value, token_level=token_level)

        kept = ([int(m.sum()) for m in batch[LOSS_MASK]] if LOSS_MASK in batch  # tool tokens are out
                else [r.numel() for r in batch["responses"]])
        return self._mini_batch_step(self.critic, batch, kept, loss_fn, CRITIC_TRAIN.micro_batch_key,
                                     "token-mean" if token_level else "seq-mean-token-mean", with_entropy=False)

    # ------------------------------------------------------------ checkpoints

    def save_checkpoint(self, folder: str, with_optimizer: bool = True, with_rng: bool = True) -> str:
        self._save_engine(self.critic, folder, CRITIC_DCP_DIR, CRITIC_RNG_DIR, with_optimizer, with_rng)
        return folder

    def load_checkpoint(self, folder: str, iteration: int, with_optimizer: bool = True,
                        with_rng: bool = True) -> int:
        self._load_engine(self.critic, folder, CRITIC_DCP_DIR, CRITIC_RNG_DIR, iteration, with_optimizer, with_rng)
        return iteration

    def export_hf(self, path: str) -> str:
        """HF ``save_pretrained`` of the gathered value model (a token-classification model, one label)."""
        self.critic.save(path)
        return path
