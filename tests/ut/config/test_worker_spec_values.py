"""worker_spec field by field: every value comes from its own config key (distinct values, so a swap
shows), is checked with an error naming the key, and the switches a worker acts on (the loss
normalisation token_level_loss, the sampling seed) arrive as configured."""
import math
from types import SimpleNamespace

import pytest

from mindspeed_rl.plan import worker_spec as ws
from mindspeed_rl.plan.stages import OLD, REF, TRAIN, VALUES


def _actor(**kw):
    base = dict(seed=11, bf16=True, use_flash_attn=False, distributed_backend="gloo", lr=0.125, min_lr=0.0625,
                lr_warmup_fraction=0.25, lr_decay_style="cosine", weight_decay=0.03, adam_beta1=0.81,
                adam_beta2=0.92, adam_eps=1e-7, clip_grad=2.5, micro_batch_size=3)
    return SimpleNamespace(**dict(base, **kw))


def _rl(**kw):
    base = dict(use_remove_padding=True, ref_forward_micro_batch_size=5, actor_forward_micro_batch_size=6,
                use_dynamic_bsz=True, max_packing_token_size=4096, clip_higher_enable=True, clip_ratio=0.2,
                clip_ratio_low=0.15, clip_ratio_high=0.28, kl_penalty="low_var_kl", entropy_coeff=0.001,
                token_level_loss=False, cliprange_value=0.4, loss_mode="vanilla", loss_agg_mode=None,
                loss_scale_factor=None)
    return SimpleNamespace(**dict(base, **kw))


def _gen(trust_remote_code=False, **sampling):
    base = dict(max_tokens=64, temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, seed=123)
    return SimpleNamespace(trust_remote_code=trust_remote_code, sampling_config=dict(base, **sampling))


@pytest.fixture(autouse=True)
def _no_rollout_probe(monkeypatch):
    """The rollout part (vLLM or HF) is rollout_spec's own business."""
    monkeypatch.setattr(ws, "rollout_spec", lambda actor, gen: ws.RolloutSpec("hf", "test"))


def _spec(actor=None, rl=None, gen=None, section="actor_config"):
    return ws.worker_spec(actor or _actor(), rl or _rl(), gen or _gen(), section)


def test_every_field_comes_from_its_key():
    s = _spec()
    assert s.engine == ws.EngineSpec(seed=11, bf16=True, use_flash_attn=False, use_remove_padding=True,
                                     trust_remote_code=False, distributed_backend="gloo")
    assert s.optimizer == ws.OptimizerSpec(lr=0.125, min_lr=0.0625, lr_warmup_fraction=0.25, lr_decay_style="cosine",
                                           weight_decay=0.03, betas=(0.81, 0.92), eps=1e-7, clip_grad=2.5)
    assert s.sampling == ws.SamplingSpec(max_tokens=64, temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, seed=123)
    assert s.micro_batches == ws.MicroBatchSpec(use_dynamic_bsz=True, max_packing_token_size=4096, sizes=(
        (REF.micro_batch_key, 5), (OLD.micro_batch_key, 6), (TRAIN.micro_batch_key, 3)))
    assert s.loss == ws.LossSpec(clip_ratio=0.2, clip_ratio_low=0.15, clip_ratio_high=0.28, kl_penalty="low_var_kl",
                                 entropy_coeff=0.001, token_level_loss=False, cliprange_value=0.4,
                                 loss_mode="vanilla", agg_mode="seq-mean-token-mean", horizon=64.0)
    assert s.rollout == ws.RolloutSpec("hf", "test")
    assert VALUES.micro_batch_key == TRAIN.micro_batch_key  # the critic's forward reads the section's size too


def test_values_are_plain_python_types():
    s = _spec(_actor(seed=11.0, lr=1, adam_beta1=1), _rl(max_packing_token_size=4096.0), _gen(max_tokens=64.0))
    assert type(s.engine.seed) is int and type(s.micro_batches.max_packing_token_size) is int
    assert type(s.sampling.max_tokens) is int and type(s.optimizer.lr) is float
    assert type(s.optimizer.betas[0]) is float


@pytest.mark.parametrize("token_level", [True, False])
def test_loss_normalisation_switch_reaches_the_spec(token_level):
    assert _spec(rl=_rl(token_level_loss=token_level)).loss.token_level_loss is token_level


@pytest.mark.parametrize("seed", [None, 0, 77])
def test_sampling_seed_reaches_the_spec(seed):
    assert _spec(gen=_gen(seed=seed)).sampling.seed == seed


def test_clip_bounds_only_with_clip_higher():
    loss = _spec(rl=_rl(clip_higher_enable=False)).loss
    assert (loss.clip_ratio_low, loss.clip_ratio_high, loss.clip_ratio) == (None, None, 0.2)
    with pytest.raises(ValueError, match=r"rl_config.clip_higher_enable='yes' must be true or false"):
        _spec(rl=_rl(clip_higher_enable="yes"))


def test_unset_micro_batch_sizes_stay_unset():
    s = _spec(_actor(micro_batch_size=None), _rl(ref_forward_micro_batch_size=None))
    assert s.micro_batches.size(REF.micro_batch_key) is None and s.micro_batches.size(TRAIN.micro_batch_key) is None
    assert s.micro_batches.size(OLD.micro_batch_key) == 6


def test_micro_batch_size_lookup():
    sizes = ws.MicroBatchSpec(False, 8, (("a", 1), ("b", None)))
    assert sizes.size("a") == 1 and sizes.size("b") is None
    with pytest.raises(KeyError, match=r"worker spec has no micro-batch size 'c'; it has \['a', 'b'\]"):
        sizes.size("c")


@pytest.mark.parametrize("temperature, used", [(0.7, 0.7), (1.5, 1.5), (0.0, 1.0), (-1.0, 1.0)])
def test_log_prob_temperature(temperature, used):
    assert ws.SamplingSpec(8, temperature, 1.0, -1, 0.0).log_prob_temperature == used


@pytest.mark.parametrize("where, value, message", [
    ("actor", {"seed": 1.5}, "actor_config.seed=1.5 must be an int"),
    ("actor", {"seed": True}, "actor_config.seed=True must be an int"),
    ("actor", {"seed": None}, "actor_config.seed=None must be an int"),
    ("actor", {"seed": "3"}, "actor_config.seed='3' must be an int"),
    ("actor", {"lr": math.inf}, "actor_config.lr=inf must be a finite number"),
    ("actor", {"lr": math.nan}, "actor_config.lr=nan must be a finite number"),
    ("actor", {"min_lr": "x"}, "actor_config.min_lr='x' must be a finite number"),
    ("actor", {"lr_warmup_fraction": None}, "actor_config.lr_warmup_fraction=None must be a finite number"),
    ("actor", {"lr_decay_style": 3}, "actor_config.lr_decay_style=3 must be a string"),
    ("actor", {"weight_decay": False}, "actor_config.weight_decay=False must be a finite number"),
    ("actor", {"adam_beta1": "b"}, "actor_config.adam_beta1='b' must be a finite number"),
    ("actor", {"adam_beta2": "b"}, "actor_config.adam_beta2='b' must be a finite number"),
    ("actor", {"adam_eps": "e"}, "actor_config.adam_eps='e' must be a finite number"),
    ("actor", {"clip_grad": "c"}, "actor_config.clip_grad='c' must be a finite number"),
    ("actor", {"bf16": 1}, "actor_config.bf16=1 must be true or false"),
    ("actor", {"use_flash_attn": "no"}, "actor_config.use_flash_attn='no' must be true or false"),
    ("actor", {"distributed_backend": None}, "actor_config.distributed_backend=None must be a string"),
    ("actor", {"micro_batch_size": 0}, r"actor_config.micro_batch_size=0 must be an int > 0 or unset"),
    ("rl", {"use_remove_padding": None}, "rl_config.use_remove_padding=None must be true or false"),
    ("rl", {"actor_forward_micro_batch_size": -2},
     r"rl_config.actor_forward_micro_batch_size=-2 must be an int > 0 or unset"),
    ("rl", {"ref_forward_micro_batch_size": 2.5},
     r"rl_config.ref_forward_micro_batch_size=2.5 must be an int > 0 or unset"),
    ("rl", {"use_dynamic_bsz": "true"}, "rl_config.use_dynamic_bsz='true' must be true or false"),
    ("rl", {"max_packing_token_size": 0}, r"rl_config.max_packing_token_size=0 must be an int > 0$"),
    ("rl", {"max_packing_token_size": None}, r"rl_config.max_packing_token_size=None must be an int > 0$"),
    ("rl", {"clip_ratio": "a"}, "rl_config.clip_ratio='a' must be a finite number"),
    ("rl", {"clip_ratio_low": None}, "rl_config.clip_ratio_low=None must be a finite number"),
    ("rl", {"clip_ratio_high": None}, "rl_config.clip_ratio_high=None must be a finite number"),
    ("rl", {"kl_penalty": None}, "rl_config.kl_penalty=None must be a string"),
    ("rl", {"entropy_coeff": None}, "rl_config.entropy_coeff=None must be a finite number"),
    ("rl", {"token_level_loss": 0}, "rl_config.token_level_loss=0 must be true or false"),
    ("rl", {"cliprange_value": None}, "rl_config.cliprange_value=None must be a finite number"),
    ("rl", {"loss_mode": 3}, "rl_config.loss_mode=3 must be a string"),
    ("rl", {"loss_mode": "ppo"}, "rl_config.loss_mode='ppo' is not a known policy loss; known: ['cispo'"),
    ("rl", {"loss_scale_factor": 0}, r"rl_config.loss_scale_factor=0 must be a finite number > 0 or unset$"),
    ("rl", {"loss_scale_factor": "8"}, r"rl_config.loss_scale_factor='8' must be a finite number > 0 or unset$"),
    ("rl", {"loss_agg_mode": "mean"}, "rl_config.loss_agg_mode='mean' is not one of ['token"),
    ("rl", {"loss_agg_mode": "token-mean"},
     "rl_config.loss_agg_mode='token-mean' contradicts rl_config.token_level_loss="),
    ("gen", {"max_tokens": 0}, r"generate_config.sampling_config.max_tokens=0 must be an int > 0$"),
    ("gen", {"temperature": None}, "generate_config.sampling_config.temperature=None must be a finite number"),
    ("gen", {"top_p": "p"}, "generate_config.sampling_config.top_p='p' must be a finite number"),
    ("gen", {"top_k": 1.5}, "generate_config.sampling_config.top_k=1.5 must be an int"),
    ("gen", {"min_p": None}, "generate_config.sampling_config.min_p=None must be a finite number"),
    ("gen", {"seed": 2.5}, r"generate_config.sampling_config.seed=2.5 must be an int or unset"),
])
def test_bad_value_names_its_key(where, value, message):
    parts = {"actor": _actor(), "rl": _rl(), "gen": _gen()}
    if where == "gen":
        parts["gen"] = _gen(**value)
    else:
        parts[where] = {"actor": _actor, "rl": _rl}[where](**value)
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace("[", r"\[")):
        _spec(parts["actor"], parts["rl"], parts["gen"])


def test_trust_remote_code_is_checked():
    with pytest.raises(ValueError, match="^generate_config.trust_remote_code=None must be true or false"):
        _spec(gen=_gen(trust_remote_code=None))


def test_critic_section_names_its_own_keys():
    with pytest.raises(ValueError, match=r"^critic_config.lr='x' must be a finite number"):
        _spec(actor=_actor(lr="x"), section="critic_config")
    with pytest.raises(ValueError, match=r"^critic_config.micro_batch_size=0 must be an int > 0 or unset"):
        _spec(actor=_actor(micro_batch_size=0), section="critic_config")
    # the rl_config keys keep their section
    with pytest.raises(ValueError, match=r"^rl_config.actor_forward_micro_batch_size=0 must be an int > 0"):
        _spec(rl=_rl(actor_forward_micro_batch_size=0), section="critic_config")


def test_number_accepts_integral_floats_and_bounds():
    assert ws._number("k", 4.0, int) == 4 and ws._number("k", 3, float) == 3.0
    assert ws._number("k", None, int, optional=True) is None
    assert ws._number("k", 1, int, positive=True) == 1
    assert ws._number("k", 0, int) == 0 and ws._number("k", -0.5, float) == -0.5
    with pytest.raises(ValueError, match=r"^k=0.0 must be a finite number > 0$"):
        ws._number("k", 0.0, float, positive=True)


def test_default_worker_spec_is_the_config_defaults():
    from mindspeed_rl.config_cls.generate_config import GenerateConfig
    from mindspeed_rl.config_cls.megatron_config import MegatronConfig
    from mindspeed_rl.config_cls.rl_config import RLConfig
    spec = ws.default_worker_spec()
    assert spec == ws.worker_spec(MegatronConfig({}, {}), RLConfig({}), GenerateConfig({"rollout_backend": "hf"}))
    assert spec.loss.token_level_loss is True and spec.sampling.seed is None


@pytest.mark.parametrize("token_level, given, mode", [
    (True, None, "token-mean"), (False, None, "seq-mean-token-mean"),
    (True, "seq-mean-token-sum-norm", "seq-mean-token-sum-norm"), (False, "seq-mean-token-mean", "seq-mean-token-mean")])
def test_the_aggregation_is_the_given_mode_or_upstreams_switch(token_level, given, mode):
    loss = _spec(rl=_rl(token_level_loss=token_level, loss_agg_mode=given)).loss
    assert loss.agg_mode == mode and loss.token_level_loss is token_level


def test_loss_mode_and_horizon_arrive_as_configured():
    loss = _spec(rl=_rl(loss_mode="gspo", loss_scale_factor=7)).loss
    assert loss.loss_mode == "gspo" and loss.horizon == 7.0 and isinstance(loss.horizon, float)
    assert _spec(rl=_rl()).loss.horizon == 64.0  # unset: the sampling's max_tokens


def test_a_contradiction_names_both_keys_and_the_mode_the_switch_implies():
    with pytest.raises(ValueError) as info:
        _spec(rl=_rl(token_level_loss=False, loss_agg_mode="seq-mean-token-sum"))
    assert str(info.value) == ("rl_config.loss_agg_mode='seq-mean-token-sum' contradicts rl_config.token_level_loss="
                               "false (seq-mean-token-mean); give one of the two")
