"""A rollout engine of the async trainer modes (rl_config.trainer_mode: colocate_async, separate_async): one
whole copy of the policy per rank, no optimizer and no reference; it serves rollout rounds from the queue as the
integrated worker does, with the weights the trainer last pushed (``load_weights``), and says which version."""
from mindspeed_rl.models.causal_lm import CausalLMEngine
from mindspeed_rl.workers.integrated_worker import IntegratedWorker


class RolloutEngineWorker(IntegratedWorker):
    def initialize(self, model_path: str, eos_id: int, pad_id: int):
        # the rollout group's plan is DDP (RunPlan.for_group): no mesh, a whole model; fp32 weights as the
        # trainer's master weights come, computed as the actor computes
        self.actor = CausalLMEngine(model_path, trainable=False, autocast_dtype=self._half(),
                                    **self._engine_kwargs(pad_id))
        self.ref, self.version = None, 0
        self.eos_id, self.pad_id = eos_id, pad_id
        self.rollout = self._rollout_backend(model_path)
        return self.rank

    def load_weights(self, state, version: int) -> int:
        """The trainer's full state dict (``IntegratedWorker.policy_state``) as weight version ``version``."""
        own = self.actor.module.state_dict()
        # checked before anything loads: a bad push leaves the engine on its last version
        missing = sorted(k for k in own if k not in state and not k.endswith("lm_head.weight"))
        unexpected = sorted(k for k in state if k not in own)
        wrong = sorted(k for k in state if k in own and tuple(state[k].shape) != tuple(own[k].shape))
        if missing or unexpected or wrong:
            raise ValueError(f"rollout engine {self.rank}: weight version {version} does not fit the model "
                             f"(missing {missing[:4]}, unexpected {unexpected[:4]}, other shapes {wrong[:4]}); "
                             f"it keeps version {self.version}")
        self.actor.module.load_state_dict(state, strict=False)
        self.version = int(version)
        self.rollout.weights_changed()
        return self.version

    def weight_version(self) -> int:
        return self.version

    def save_checkpoint(self, folder: str, with_optimizer: bool = True, with_rng: bool = True) -> str:
        return folder  # the driver saves the engines' weights when they differ from the trainer's

    def load_checkpoint(self, folder: str, iteration: int, with_optimizer: bool = True,
                        with_rng: bool = True) -> int:
        return iteration  # the driver pushes the weights the engines held (trainer/modes/pipeline.py)
