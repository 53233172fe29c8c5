"""What a worker process reads of the configs, as plain frozen values.

The driver keeps the config objects; each worker gets only the run plan,
whose ``worker`` field is the ``WorkerSpec`` built here. The layout, the RL
seed, the timeouts and the stages stay in the run plan itself.
"""
from dataclasses import dataclass, field
from typing import Optional, Tuple

from mindspeed_rl.algorithms import POLICY_LOSSES
from mindspeed_rl.algorithms.aggregation import check_mode
from mindspeed_rl.config_cls.checks import flag as _flag, number as _number, text as _text
from mindspeed_rl.plan.rollout_spec import RolloutSpec, rollout_spec
from mindspeed_rl.plan.stages import OLD, REF, TRAIN, VALUES


@dataclass(frozen=True)
class EngineSpec:
    seed: int                  # megatron_training.seed: rank r seeds its global streams with seed + r
    bf16: bool
    use_flash_attn: bool
    use_remove_padding: bool
    trust_remote_code: bool
    distributed_backend: str


@dataclass(frozen=True)
class OptimizerSpec:
    lr: float
    min_lr: float
    lr_warmup_fraction: float  # of the run plan's optimizer steps
    lr_decay_style: str
    weight_decay: float
    betas: Tuple[float, float]
    eps: float
    clip_grad: float


@dataclass(frozen=True)
class SamplingSpec:
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int                 # -1: no limit
    min_p: float
    seed: Optional[int] = None  # None: the run plan's seed

    @property
    def log_prob_temperature(self) -> float:
        """Log-probs use the sampling temperature, so ratios compare like with like (<= 0: 1.0)."""
        return self.temperature if self.temperature > 0 else 1.0


@dataclass(frozen=True)
class MicroBatchSpec:
    use_dynamic_bsz: bool
    max_packing_token_size: int
    # (Stage.micro_batch_key, size) for each DP stage that cuts micro-batches; None: the whole share
    sizes: Tuple[Tuple[str, Optional[int]], ...] = ()

    def size(self, key: str) -> Optional[int]:
        for name, value in self.sizes:
            if name == key:
                return value
        raise KeyError(f"worker spec has no micro-batch size '{key}'; it has {[n for n, _ in self.sizes]}")


@dataclass(frozen=True)
class LossSpec:
    clip_ratio: float
    clip_ratio_low: Optional[float]   # set only with clip_higher_enable
    clip_ratio_high: Optional[float]
    kl_penalty: str
    entropy_coeff: float
    token_level_loss: bool           # upstream's switch; agg_mode is what the losses read
    cliprange_value: float = 0.5  # PPO critic: values move at most this far from the rollout's per step
    loss_mode: str = "vanilla"       # rl_config.loss_mode: a registered policy loss
    agg_mode: str = "token-mean"     # rl_config.loss_agg_mode, or token_level_loss's mode
    horizon: Optional[float] = None  # seq-mean-token-sum-norm's length (loss_scale_factor or max_tokens)


@dataclass(frozen=True)
class WorkerSpec:
    engine: EngineSpec
    optimizer: OptimizerSpec
    sampling: SamplingSpec
    micro_batches: MicroBatchSpec
    loss: LossSpec
    rollout: RolloutSpec = field(default_factory=lambda: RolloutSpec("hf", "default"))


def _agg_mode(rl, token_level: bool) -> str:
    """rl_config.loss_agg_mode, or upstream's token_level_loss as a mode; the two must agree when both are set."""
    implied = "token-mean" if token_level else "seq-mean-token-mean"
    if rl.loss_agg_mode is None:
        return implied
    mode = check_mode(rl.loss_agg_mode)
    if not token_level and mode != implied:
        raise ValueError(f"rl_config.loss_agg_mode={mode!r} contradicts rl_config.token_level_loss=false "
                         f"({implied}); give one of the two")
    return mode


def worker_spec(actor_config, rl_config, generate_config, section: str = "actor_config") -> WorkerSpec:
    """The fields a worker of the group configured by ``section`` (actor_config or critic_config) reads,
    from the driver's configs (checked, plain values)."""
    a, rl, s, sec = actor_config, rl_config, generate_config.sampling_config, section
    engine = EngineSpec(seed=_number(f"{sec}.seed", a.seed, int), bf16=_flag(f"{sec}.bf16", a.bf16),
                        use_flash_attn=_flag(f"{sec}.use_flash_attn", a.use_flash_attn),
                        use_remove_padding=_flag("rl_config.use_remove_padding", rl.use_remove_padding),
                        trust_remote_code=_flag("generate_config.trust_remote_code",
                                                generate_config.trust_remote_code),
                        distributed_backend=_text(f"{sec}.distributed_backend", a.distributed_backend))
    optimizer = OptimizerSpec(
        lr=_number(f"{sec}.lr", a.lr, float), min_lr=_number(f"{sec}.min_lr", a.min_lr, float),
        lr_warmup_fraction=_number(f"{sec}.lr_warmup_fraction", a.lr_warmup_fraction, float),
        lr_decay_style=_text(f"{sec}.lr_decay_style", a.lr_decay_style),
        weight_decay=_number(f"{sec}.weight_decay", a.weight_decay, float),
        betas=(_number(f"{sec}.adam_beta1", a.adam_beta1, float),
               _number(f"{sec}.adam_beta2", a.adam_beta2, float)),
        eps=_number(f"{sec}.adam_eps", a.adam_eps, float),
        clip_grad=_number(f"{sec}.clip_grad", a.clip_grad, float))
    key = "generate_config.sampling_config."
    sampling = SamplingSpec(max_tokens=_number(key + "max_tokens", s["max_tokens"], int, positive=True),
                            temperature=_number(key + "temperature", s["temperature"], float),
                            top_p=_number(key + "top_p", s["top_p"], float),
                            top_k=_number(key + "top_k", s["top_k"], int),
                            min_p=_number(key + "min_p", s["min_p"], float),
                            seed=_number(key + "seed", s["seed"], int, optional=True))
    # the train stages' size is megatron's micro_batch_size (of the section; the critic's forward too),
    # the actor's forward stages' rl_config keys
    sources = {REF.micro_batch_key: ("rl_config", rl), OLD.micro_batch_key: ("rl_config", rl),
               TRAIN.micro_batch_key: (sec, a), VALUES.micro_batch_key: (sec, a)}
    sizes = tuple((k, _number(f"{section}.{k}", getattr(cfg, k), int, optional=True, positive=True))
                  for k, (section, cfg) in sources.items())
    micro = MicroBatchSpec(use_dynamic_bsz=_flag("rl_config.use_dynamic_bsz", rl.use_dynamic_bsz),
                           max_packing_token_size=_number("rl_config.max_packing_token_size",
                                                          rl.max_packing_token_size, int, positive=True),
                           sizes=sizes)
    higher = _flag("rl_config.clip_higher_enable", rl.clip_higher_enable)
    token_level = _flag("rl_config.token_level_loss", rl.token_level_loss)
    loss = LossSpec(clip_ratio=_number("rl_config.clip_ratio", rl.clip_ratio, float),
                    clip_ratio_low=_number("rl_config.clip_ratio_low", rl.clip_ratio_low, float) if higher else None,
                    clip_ratio_high=_number("rl_config.clip_ratio_high", rl.clip_ratio_high, float) if higher else None,
                    kl_penalty=_text("rl_config.kl_penalty", rl.kl_penalty),
                    entropy_coeff=_number("rl_config.entropy_coeff", rl.entropy_coeff, float),
                    token_level_loss=token_level,
                    cliprange_value=_number("rl_config.cliprange_value", rl.cliprange_value, float),
                    loss_mode=POLICY_LOSSES.canonical(_text("rl_config.loss_mode", rl.loss_mode)),
                    agg_mode=_agg_mode(rl, token_level),
                    horizon=_number("rl_config.loss_scale_factor", rl.loss_scale_factor, float, optional=True,
                                    positive=True) or float(sampling.max_tokens))
    return WorkerSpec(engine, optimizer, sampling, micro, loss, rollout_spec(actor_config, generate_config))


def default_worker_spec() -> WorkerSpec:
    """The spec of the config classes' defaults: for run plans built by hand (tests), not from configs."""
    from mindspeed_rl.config_cls.generate_config import GenerateConfig
    from mindspeed_rl.config_cls.megatron_config import MegatronConfig
    from mindspeed_rl.config_cls.rl_config import RLConfig
    return worker_spec(MegatronConfig({}, {}), RLConfig({}), GenerateConfig({"rollout_backend": "hf"}))

