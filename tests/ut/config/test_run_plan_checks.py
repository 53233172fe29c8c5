"""build_run_plan on config objects built in the test (no YAML): each refusal's whole message (the key and
the numbers it names), the layouts it picks or folds, the DAPO and PPO specs it hands on, and the plan's
derived numbers and lookups."""
import warnings

import pytest

from vllm_need import plan_needs_vllm

from mindspeed_rl.config_cls import GenerateConfig, MegatronConfig, RLConfig
from mindspeed_rl.plan import layout, stages as table
from mindspeed_rl.plan.rollout_spec import vllm_version
from mindspeed_rl.plan.run_plan import (GroupFilterSpec, Layout, OverlongSpec, PlanError, RunPlan, StagePlan,
                                              build_run_plan)


def _configs(rl=None, actor=None, gen=None, critic=None, ppo=False):
    """8 prompts x 4 samples (32 rows) on 2 devices (DP 2), mini-batches of 4 prompts; with ``ppo`` a critic
    on 2 devices of its own."""
    actor_cfg = MegatronConfig({"global_batch_size": 8, "seq_length": 32, "train_iters": 3, "micro_batch_size": 2,
                                **({"stage": "ray_ppo"} if ppo else {}), **(actor or {})}, {})
    rl_cfg = RLConfig({"n_samples_per_prompt": 4, "mini_batch_size": 4, "max_prompt_length": 8,
                       "actor_resource": {"num_npus": 2},
                       **({"adv_estimator": "gae", "critic_resource": {"num_npus": 2}} if ppo else {}),
                       **(rl or {})})
    # rollout TP as the actor's (another one warns: test_a_rollout_tp_other_than_the_actors_warns...)
    gen_cfg = GenerateConfig({"infer_tensor_parallel_size": (actor or {}).get("tensor_model_parallel_size", 1),
                              **(gen or {})})
    critic_cfg = MegatronConfig({"micro_batch_size": 2, **(critic or {})}, {}) if ppo else None
    return actor_cfg, rl_cfg, gen_cfg, critic_cfg


def _plan(rl=None, actor=None, gen=None, critic=None, ppo=False):
    return build_run_plan(*_configs(rl, actor, gen, critic, ppo))


def _refused(*args, **kwargs):
    with pytest.raises(PlanError) as info:
        _plan(*args, **kwargs)
    return str(info.value)


def _refused_set(section, key, value, **kwargs):
    """The refusal of a value set on the built config object (past the config classes' type checks, as
    code that fills the configs in may do)."""
    cfgs = _configs(**kwargs)
    setattr(cfgs[{"actor": 0, "rl": 1, "critic": 3}[section]], key, value)
    with pytest.raises(PlanError) as info:
        build_run_plan(*cfgs)
    return str(info.value)


# ------------------------------------------------------------------ layout


def test_device_count_must_be_set():
    assert _refused({"actor_resource": {"num_npus": None}}) == \
        "rl_config.actor_resource.num_npus is not set; the run plan needs the device count"


@pytest.mark.parametrize("tp", [0, 3])
def test_tensor_parallel_size_must_divide_the_devices(tp):
    assert _refused(actor={"tensor_model_parallel_size": tp}) == \
        f"rl_config.actor_resource.num_npus=2 must be divisible by actor_config.tensor_model_parallel_size={tp}"


@pytest.mark.parametrize("key, value", [("pipeline_model_parallel_size", 0), ("context_parallel_size", -1),
                                        ("expert_model_parallel_size", "2")])
def test_folded_parallel_sizes_must_be_positive_ints(key, value):
    assert _refused_set("actor", key, value) == f"actor_config.{key}={value!r} must be a positive int"


@pytest.mark.parametrize("devices, pp, cp", [(4, 2, 3), (2, 1, 4), (2, 4, 1)])
def test_pipeline_times_context_must_divide_the_devices(devices, pp, cp):
    assert _refused({"actor_resource": {"num_npus": devices}},
                    {"pipeline_model_parallel_size": pp, "context_parallel_size": cp}) == \
        (f"rl_config.actor_resource.num_npus={devices} must be divisible by tensor x pipeline x context parallel = "
         f"1 x {pp} x {cp}")


def test_expert_parallel_must_divide_the_data_parallel_size():
    assert _refused({"actor_resource": {"num_npus": 4}}, {"expert_model_parallel_size": 3}) == \
        "actor_config.expert_model_parallel_size=3 must divide the data parallel size 4 (4 devices / (TP 1 x PP 1 x CP 1))"


def test_given_rollout_dp_must_match_the_layout():
    assert _refused(gen={"data_parallel_size": 1}) == \
        ("generate_config.data_parallel_size=1 disagrees with the layout's data parallel size 2; leave it unset "
         "(it is derived)")
    assert _plan(gen={"data_parallel_size": 2}).layout.dp == 2


@pytest.mark.parametrize("actor, engine", [
    ({}, "ddp"),
    ({"tensor_model_parallel_size": 2}, "tp"),
    ({"use_distributed_optimizer": True}, "fsdp"),
])
def test_engine_follows_tp_and_the_distributed_optimizer(actor, engine):
    devices = {"actor_resource": {"num_npus": 4}}
    layout = _plan(devices, actor).layout
    assert layout.engine == engine and layout.world_size == 4
    assert (layout.dp, layout.tp) == ((2, 2) if engine == "tp" else (4, 1))
    assert (layout.asked, layout.note) == ("", "")


def test_distributed_optimizer_needs_more_than_one_dp_rank():
    assert _refused(actor={"use_distributed_optimizer": True, "tensor_model_parallel_size": 2}) == \
        ("megatron_training.use_distributed_optimizer=true shards over data parallel ranks, but the layout has DP=1 "
         "(2 devices / TP 2); set it to false")


def test_pipeline_parallel_is_folded_into_dp_and_said_once(capsys):
    layout = _plan({"actor_resource": {"num_npus": 4}}, {"pipeline_model_parallel_size": 2}).layout
    assert (layout.world_size, layout.dp, layout.tp, layout.engine) == (4, 4, 1, "fsdp")
    assert layout.asked == "TP=1 x PP=2 x DP=2"
    assert layout.note == ("layout: the config asks for TP=1 x PP=2 x DP=2 on 4 devices; runs DP=4 x TP=1 with the "
                           "sharded engine (FSDP2 over 4 DP ranks) on the same 4 devices, because pipeline "
                           "parallelism is not implemented; the training math is the same")
    assert capsys.readouterr().err == layout.note + "\n"


def test_folding_several_kinds_names_them_all_and_the_unused_layer_list(capsys):
    layout = _plan({"actor_resource": {"num_npus": 8}, "mini_batch_size": 8},
                   {"tensor_model_parallel_size": 2, "context_parallel_size": 2, "expert_model_parallel_size": 2,
                    "num_layer_list": "1,1"}).layout
    assert (layout.dp, layout.tp, layout.asked) == (4, 2, "TP=2 x CP=2 x EP=2 x DP=2")
    assert layout.note == ("layout: the config asks for TP=2 x CP=2 x EP=2 x DP=2 on 8 devices; runs DP=4 x TP=2 "
                           "with the sharded engine (FSDP2 over 4 DP ranks) on the same 8 devices, because context "
                           "and expert parallelism are not implemented; the training math is the same; "
                           "num_layer_list=1,1 has no stages to size")
    assert capsys.readouterr().err == layout.note + "\n"


def test_a_folded_critic_layout_names_its_section(capsys):
    plan = _plan({"critic_resource": {"num_npus": 4}}, critic={"pipeline_model_parallel_size": 2}, ppo=True)
    assert plan.critic.layout.engine == "fsdp" and plan.layout.engine == "ddp"
    assert plan.critic.layout.note.startswith("layout of critic_config: the config asks for TP=1 x PP=2 x DP=2 "
                                              "on 4 devices; runs DP=4 x TP=1")


def test_a_critic_on_one_rank_with_the_distributed_optimizer_names_critic_config():
    assert _refused({"critic_resource": {"num_npus": 1}}, critic={"use_distributed_optimizer": True}, ppo=True) == \
        ("critic_config.use_distributed_optimizer=true shards over data parallel ranks, but the layout has DP=1 "
         "(1 devices / TP 1); set it to false")


def test_rollout_pipeline_parallel_is_refused():
    assert _refused(gen={"infer_pipeline_parallel_size": 2}) == \
        ("generate_config.infer_pipeline_parallel_size=2 is not implemented; rollout runs on the actor's layout "
         "(DP x TP; pipeline, context and expert parallel ranks are folded into DP)")


def test_a_rollout_tp_other_than_the_actors_warns_and_runs_on_the_actor_layout():
    with pytest.warns(UserWarning) as caught:
        plan = _plan(gen={"infer_tensor_parallel_size": 2})
    assert [str(w.message) for w in caught] == [
        "generate_config.infer_tensor_parallel_size=2 is not implemented: rollout runs on the actor's layout "
        "(tensor_model_parallel_size=1; with vLLM every rank's engine holds the whole model, inference TP across "
        "ranks is not implemented)"]
    assert plan.layout.tp == 1


# ------------------------------------------------------------------ batch sizes and dispatch sizes


def test_mini_batch_must_be_a_multiple_of_the_samples_per_prompt():
    actor, rl, gen, _ = _configs()
    rl.mini_batch_size = 6  # set directly: the config class multiplies prompts by samples
    with pytest.raises(PlanError) as info:
        build_run_plan(actor, rl, gen)
    assert str(info.value) == "rl_config.mini_batch_size=6 (in samples) must be a multiple of rl_config.n_samples_per_prompt=4"


def test_mini_batch_must_divide_the_train_batch():
    assert _refused({"mini_batch_size": 3}) == (
        "rl_config.mini_batch_size=3 prompts (12 samples with n_samples_per_prompt=4) must divide the train batch of "
        "8 prompts (32 samples: global_batch_size, or filter_groups_train_batch_size with filter_groups_enable)")


def test_mini_batch_must_split_over_the_dp_ranks():
    assert _refused({"mini_batch_size": 1, "n_samples_per_prompt": 1}, {"global_batch_size": 2}) == \
        "rl_config.mini_batch_size=1 (in samples) must be divisible by the data parallel size 2"


def test_micro_batch_must_divide_a_ranks_mini_batch_unless_dynamic():
    assert _refused(actor={"micro_batch_size": 3}) == \
        "rl_config.mini_batch_size // data parallel size = 8 must be divisible by micro_batch_size=3"
    assert _plan({"use_dynamic_bsz": True, "max_packing_token_size": 64}, {"micro_batch_size": 3}).mini_batches == 2


@pytest.mark.parametrize("size", [5, 0, -4])
def test_a_dispatch_size_must_divide_the_round(size):
    assert _refused({"actor_logprob_dispatch_size": size}) == (
        f"rl_config.actor_logprob_dispatch_size={size} must be a positive divisor of the 32 rows of a round "
        f"(global_batch_size * n_samples_per_prompt)")


def test_a_dispatch_size_must_give_every_rank_the_same_shares():
    assert _refused({"ref_dispatch_size": 32}) == (
        "rl_config.ref_dispatch_size=32 gives 1 shares per round, not a multiple of the data parallel size 2: every "
        "DP rank must take the same number of shares")


def test_dispatch_sizes_set_the_shares_per_rank():
    plan = _plan({"actor_logprob_dispatch_size": 1, "ref_dispatch_size": 4})
    old, ref = plan.stages["actor_log_prob"], plan.stages["ref_log_prob"]
    assert (old.rows_per_share, old.shares_per_rank, old.planned_rows) == (1, 16, 16)
    assert (ref.rows_per_share, ref.shares_per_rank, ref.config_key) == (4, 4, "ref_dispatch_size")
    # unset: one share per rank; the update: one share per optimizer step
    assert (plan.stages["actor_rollout"].rows_per_share, plan.stages["actor_rollout"].shares_per_rank) == (16, 1)
    assert (plan.stages["actor_train"].rows_per_share, plan.stages["actor_train"].shares_per_rank) == (8, 2)


@pytest.mark.parametrize("size", [True, 0, -8, "8", 2.0])
def test_update_dispatch_size_must_be_a_positive_int(size):
    assert _refused_set("rl", "actor_update_dispatch_size", size) == \
        f"rl_config.actor_update_dispatch_size={size!r} must be a positive int"


def test_update_dispatch_size_that_cuts_upstreams_mini_batches_unevenly_is_refused():
    assert _refused({"actor_update_dispatch_size": 12}) == (
        "rl_config.actor_update_dispatch_size=12 is not a multiple of the rows a rank trains per optimizer step in "
        "the config's layout (mini_batch_size // DP = 8): upstream would train on uneven mini-batches; give a "
        "multiple of 8 or leave it unset")


@pytest.mark.parametrize("size", [1, 4, 16, 24])
def test_other_update_dispatch_sizes_run_the_same_mini_batches_and_say_so(size):
    with pytest.warns(UserWarning) as caught:
        _plan({"actor_update_dispatch_size": size})
    assert [str(w.message) for w in caught] == [
        f"rl_config.actor_update_dispatch_size={size} only sizes upstream's update fetches: each optimizer step "
        f"here trains on mini_batch_size // DP = 8 rows per rank (DP=2), the same mini-batches"]


def test_update_dispatch_size_of_one_mini_batch_share_is_silent():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _plan({"actor_update_dispatch_size": 8})


def test_update_dispatch_size_is_judged_in_the_configs_unfolded_layout():
    """PP=2 on 4 devices: upstream's DP is 2 (8 rows per step and 16 per rank), ours 4 (4 rows per step)."""
    with pytest.raises(PlanError, match=r"actor_update_dispatch_size=12 is not a multiple .*= 8\)"):
        _plan({"actor_resource": {"num_npus": 4}, "actor_update_dispatch_size": 12},
              {"pipeline_model_parallel_size": 2})
    with pytest.warns(UserWarning, match=r"mini_batch_size // DP = 4 rows per rank \(DP=4\)"):
        _plan({"actor_resource": {"num_npus": 4}, "actor_update_dispatch_size": 8},
              {"pipeline_model_parallel_size": 2})


# ------------------------------------------------------------------ DAPO


def test_clip_ratio_low_above_high_is_refused_only_with_clip_higher():
    keys = {"clip_ratio_low": 0.3, "clip_ratio_high": 0.2}
    assert _refused({**keys, "clip_higher_enable": True}) == \
        "rl_config.clip_ratio_low=0.3 must not exceed rl_config.clip_ratio_high=0.2 (clip_higher_enable)"
    _plan(keys)
    _plan({"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_higher_enable": True})


def _overlong(**keys):
    return {"overlong_buffer_enable": True, "rollout_max_tokens": 128, "overlong_buffer": 16, **keys}


@pytest.mark.parametrize("buffer", [0, 128, 200, -1, True, 4.0, "16"])
def test_overlong_buffer_must_be_a_positive_int_below_max_tokens(buffer):
    assert _refused_set("rl", "overlong_buffer", buffer, rl=_overlong()) == (
        f"rl_config.overlong_buffer={buffer!r} must be a positive int below sampling_config.max_tokens=128 "
        f"(overlong_buffer_enable)")


def test_overlong_needs_rollout_max_tokens_equal_to_the_sampling_max_tokens():
    assert _refused(_overlong(rollout_max_tokens=64)) == \
        "rl_config.rollout_max_tokens=64 must equal sampling_config.max_tokens=128 (overlong_buffer_enable)"


def test_overlong_spec_carries_buffer_penalty_and_max_tokens():
    plan = _plan(_overlong(overlong_buffer=127, overlong_buffer_penalty_factor=2))
    assert plan.overlong == OverlongSpec(127, 2.0, 128) and isinstance(plan.overlong.penalty_factor, float)
    assert _plan(_overlong(overlong_buffer=1)).overlong.buffer == 1
    assert _plan().overlong is None


def _filter(**keys):
    return {"filter_groups_enable": True, "filter_groups_metric": "base_acc", "filter_groups_train_batch_size": 4,
            "filter_groups_max_batches": 3, **keys}


def test_filter_metric_must_be_one_of_the_verifiers():
    assert _refused(_filter(filter_groups_metric="acc")) == \
        "rl_config.filter_groups_metric='acc' must be one of rl_config.verifier_function=['base_acc']"


@pytest.mark.parametrize("value", [0, -2, True, 4.0, None])
def test_filter_train_batch_size_must_be_a_positive_int(value):
    assert _refused_set("rl", "filter_groups_train_batch_size", value, rl=_filter()) == \
        f"rl_config.filter_groups_train_batch_size={value!r} must be a positive int"


@pytest.mark.parametrize("value", [True, 1.5, "3", None])
def test_filter_max_batches_must_be_an_int(value):
    assert _refused_set("rl", "filter_groups_max_batches", value, rl=_filter()) == \
        f"rl_config.filter_groups_max_batches={value!r} must be an int (<= 0: no limit)"


def test_group_filter_spec_and_the_train_batch_it_sets():
    plan = _plan(_filter(filter_groups_max_batches=0))
    assert plan.group_filter == GroupFilterSpec("base_acc", 4, 0)
    assert (plan.prompts_per_round, plan.train_prompts_per_round, plan.dock_prompts) == (8, 4, 8)
    assert (plan.rows_per_round, plan.train_rows_per_round, plan.mini_batches) == (32, 16, 1)
    # planned_rows: one rank's rows of a full round (the dock multiplies by DP)
    assert plan.stages["actor_rollout"].planned_rows == 16 and plan.stages["actor_train"].planned_rows == 8
    # the filter runs in the rollout phase and carries every column the train stages read and do not write
    dyn = plan.stages[table.FILTER.name]
    assert dyn.phase == "rollout" and not dyn.is_dp
    assert dyn.inputs[:len(table.FILTER.inputs)] == table.FILTER.inputs
    train = [s for s in plan.stages.values() if s.phase == "train"]
    made = {c for s in train for c in s.outputs}
    assert set(dyn.inputs[len(table.FILTER.inputs):]) == {c for s in train for c in s.inputs} - made
    assert len(set(dyn.inputs)) == len(dyn.inputs)
    # a train batch larger than a rollout batch: the dock holds the larger
    bigger = _plan(_filter(filter_groups_train_batch_size=16))
    assert (bigger.dock_prompts, bigger.train_rows_per_round, bigger.mini_batches) == (16, 64, 4)


def test_a_train_batch_of_one_prompt_is_taken():
    plan = _plan(_filter(filter_groups_train_batch_size=1, mini_batch_size=1))
    assert plan.group_filter.train_prompts == 1 and plan.train_rows_per_round == 4


def test_a_train_batch_the_mini_batch_does_not_divide_names_the_filter_key():
    with pytest.raises(PlanError, match=r"must divide the train batch of 6 prompts \(24 samples"):
        _plan(_filter(filter_groups_train_batch_size=6, filter_groups_max_batches=1), {"micro_batch_size": 1},
              )
    assert _plan(_filter()).group_filter.train_prompts == 4
    assert _plan().group_filter is None and _plan().train_prompts_per_round is None


# ------------------------------------------------------------------ PPO


def test_ppo_needs_gae_and_gae_needs_ppo():
    assert _refused({"adv_estimator": "group_norm"}, ppo=True) == (
        "rl_config.adv_estimator='group_norm' with megatron_training.stage=ray_ppo: PPO trains a critic for GAE; "
        "set adv_estimator: gae")
    assert _refused({"adv_estimator": "gae"}) == (
        "rl_config.adv_estimator='gae' needs a critic: use it with megatron_training.stage=ray_ppo, or an "
        "estimator without one (group_norm, rloo, reinforce_plus_plus, reinforce_plus_plus_baseline)")
    assert _refused({"adv_estimator": "remax"}).startswith(
        "rl_config.adv_estimator='remax' is not a known advantage estimator; known: [")
    assert _refused({"use_kl_in_reward": True}) == (
        "rl_config.use_kl_in_reward=true is read by PPO only (megatron_training.stage=ray_ppo); GRPO and DAPO take "
        "the KL in the loss (init_kl_coef)")
    assert _refused(_filter(), ppo=True) == (
        "rl_config.filter_groups_enable (DAPO dynamic sampling) is not implemented with megatron_training.stage=ray_ppo")


@pytest.mark.parametrize("key, value, bound", [
    ("gamma", -0.1, "in [0, 1]"), ("gamma", 1.5, "in [0, 1]"), ("gamma", True, "in [0, 1]"),
    ("lam", "0.9", "in [0, 1]"), ("lam", 1.01, "in [0, 1]"),
    ("cliprange_value", -0.5, ">= 0"), ("cliprange_value", None, ">= 0"),
])
def test_gae_numbers_are_checked_with_their_bounds(key, value, bound):
    assert _refused_set("rl", key, value, ppo=True) == f"rl_config.{key}={value!r} must be a number {bound}"


@pytest.mark.parametrize("key, value", [("gamma", 0), ("gamma", 1), ("lam", 0.0), ("lam", 1.0),
                                        ("cliprange_value", 0), ("cliprange_value", 1e6)])
def test_gae_numbers_at_their_bounds_are_taken(key, value):
    assert _plan({key: value}, ppo=True).critic is not None


def test_gae_spec_is_built_from_the_configs():
    plan = _plan({"gamma": 1, "lam": 0, "kl_penalty": "k1", "use_kl_in_reward": True, "init_kl_coef": 0.05},
                 ppo=True)
    assert (plan.gae.gamma, plan.gae.lam, plan.gae.kl_in_reward, plan.gae.kl_penalty) == (1.0, 0.0, True, "k1")
    assert isinstance(plan.gae.gamma, float) and isinstance(plan.gae.lam, float)
    assert plan.features.kl_in_reward and not plan.features.kl_in_loss and plan.features.critic
    assert _plan().gae is None and _plan().critic is None


def test_ppo_needs_a_critic_section_and_its_devices():
    actor, rl, gen, _ = _configs(ppo=True)
    with pytest.raises(PlanError) as info:
        build_run_plan(actor, rl, gen, None)
    assert str(info.value) == ("megatron_training.stage=ray_ppo needs a critic_config section (the critic's model, "
                               "layout and optimizer)")
    assert _refused({"critic_resource": None}, ppo=True) == (
        "megatron_training.stage=ray_ppo needs rl_config.critic_resource.num_npus (the critic's devices)")


def test_critic_batch_checks_name_the_critic():
    assert _refused({"critic_resource": {"num_npus": 32}}, ppo=True) == \
        "rl_config.mini_batch_size=16 (in samples) must be divisible by the critic's data parallel size 32"
    assert _refused(critic={"micro_batch_size": 3}, ppo=True) == \
        "rl_config.mini_batch_size // critic data parallel size = 8 must be divisible by critic_config.micro_batch_size=3"
    assert _plan({"use_dynamic_bsz": True, "max_packing_token_size": 64}, critic={"micro_batch_size": 3},
                 ppo=True).critic.layout.dp == 2
    assert _refused({"critic_update_dispatch_size": 0}, ppo=True) == \
        "rl_config.critic_update_dispatch_size=0 must be a positive int"


@pytest.mark.parametrize("key, ppo", [("actor_resource", False), ("critic_resource", True)])
def test_no_devices_is_refused_naming_the_resource(key, ppo):
    assert _refused({key: {"num_npus": 0}}, ppo=ppo) == \
        f"rl_config.{key}.num_npus=0 must be at least 1 (a worker per device)"


def test_critic_group_has_its_own_layout_and_plan():
    plan = _plan({"critic_resource": {"num_npus": 4}, "use_dp_batch_balance": True, "init_kl_coef": 0.0},
                 critic={"tensor_model_parallel_size": 2}, gen={"rollout_backend": "hf"}, ppo=True)
    assert plan.roles == ("actor", "critic")
    assert plan.critic.layout == Layout(world_size=4, dp=2, tp=2, engine="tp")
    assert plan.layout_of("critic") is plan.critic.layout
    assert plan.layout_of("actor") is plan.layout and plan.layout_of("ref") is plan.layout
    group = plan.for_group("critic")
    assert group.layout is plan.critic.layout and group.worker is plan.critic.worker
    assert plan.for_group("actor") is plan and plan.for_group("ref") is plan
    assert plan.summary() == (
        "layout DP=2 TP=1 (2 workers, ddp engine); critic DP=2 TP=2 (4 workers, tp engine); 32 rows per round; "
        "actor_rollout: one queue of 32 rows over 2 engine(s), chunks of 16 rows; "
        "actor_log_prob: 1 x 16 rows/rank balanced; critic_compute_values: 1 x 16 rows/rank balanced; "
        "critic_train: 2 x 8 rows/rank balanced; actor_train: 2 x 8 rows/rank balanced")


def test_min_train_rows_is_the_most_shares_of_a_train_stage_over_its_ranks():
    # actor_train: 2 shares x DP 2; critic_train on 4 ranks: 2 shares x DP 4
    plan = _plan({"critic_resource": {"num_npus": 4}}, ppo=True)
    assert plan.stages["critic_train"].shares_per_rank == 2 and plan.critic.layout.dp == 4
    assert plan.min_train_rows == 8
    assert _plan().min_train_rows == 4
    by_hand = RunPlan(layout=Layout(2, 2, 1), prompts_per_round=1, n_samples=1, mini_batch_rows=1, epochs=1,
                      train_iters=1)
    assert by_hand.min_train_rows == 1  # no DP train stage


# ------------------------------------------------------------------ the plan's numbers and lookups


def test_plan_carries_the_configs_scalars():
    plan = _plan({"seed": 7, "placement_strategy": "SPREAD", "epochs": 2, "dp_balance_method": "greedy",
                  "use_dp_batch_balance": True})
    assert (plan.seed, plan.placement, plan.epochs, plan.train_iters) == (7, "SPREAD", 2, 3)
    assert (plan.balance.objective, plan.balance.method, plan.balance.workload) == ("tokens", "greedy", None)
    assert (plan.mini_batches, plan.steps_per_iteration, plan.optimizer_steps) == (2, 4, 12)
    assert _plan({"use_dp_batch_balance": False}).balance is None


def test_groups_other_than_actor_and_critic_are_refused_by_name():
    plan = _plan()
    for call in (plan.layout_of, plan.for_group):
        with pytest.raises(PlanError) as info:
            call("critic")
        assert str(info.value) == "the run plan has no worker group for role 'critic'"
        with pytest.raises(PlanError, match=r"^the run plan has no worker group for role 'judge'$"):
            call("judge")


def test_stage_lookup_names_the_stages_the_run_has():
    plan = _plan({"init_kl_coef": 0.0})
    with pytest.raises(KeyError) as info:
        plan.stage("ref_log_prob")
    assert info.value.args[0] == ("run plan has no stage 'ref_log_prob'; it runs ['actor_rollout', 'rule_reward', "
                                  "'compute_advantage', 'actor_log_prob', 'actor_train']")
    assert plan.stage("actor_train") is plan.stages["actor_train"]


def test_phase_stages_in_table_order():
    plan = _plan()
    assert [s.name for s in plan.phase_stages("rollout")] == ["actor_rollout", "rule_reward", "compute_advantage"]
    assert [s.name for s in plan.phase_stages("train")] == ["ref_log_prob", "actor_log_prob", "actor_train"]


def test_check_plan_names_who_and_the_counts():
    train = _plan().stages["actor_train"]  # 2 shares per rank on 2 ranks
    train.check_plan([[[0], [1]], [[2], [3]]], 2, "rank 0")
    with pytest.raises(ValueError) as info:
        train.check_plan([[[0], [1]]], 2, "the dock")
    assert str(info.value) == "the dock: stage 'actor_train' plan has 1 DP ranks, the layout 2"
    with pytest.raises(ValueError) as info:
        train.check_plan([[[0], [1]], [[2], [3], [4]]], 2, "rank 1")
    assert str(info.value) == "rank 1: stage 'actor_train' gives DP rank 1 3 shares, the run plan 2"


def test_a_stage_plan_without_a_table_row_is_a_dp_train_stage():
    plain = StagePlan("probe", rows_per_share=3, shares_per_rank=4, balanced=False, extra_outputs=("x",))
    assert (plain.phase, plain.kind, plain.is_dp, plain.planned_rows) == ("train", "dp", True, 12)
    assert plain.outputs == ("x",) and plain.cost_columns == table.LENGTH_COST


def test_summary_of_a_grpo_plan():
    assert _plan({"use_dp_batch_balance": False}, gen={"rollout_backend": "hf"}).summary() == (
        "layout DP=2 TP=1 (2 workers, ddp engine); 32 rows per round; actor_rollout: one queue of 32 rows over "
        "2 engine(s), chunks of 16 rows; ref_log_prob: 1 x 16 rows/rank; actor_log_prob: 1 x 16 rows/rank; "
        "actor_train: 2 x 8 rows/rank")
    vllm = _plan(gen={"rollout_backend": "vllm"}) if vllm_version() else None
    if vllm is not None:  # continuous takes, capped by the dispatch size
        assert vllm.summary().split("; ")[2] == ("actor_rollout: one queue of 32 rows over 2 engine(s), takes of at "
                                                 "most 16 rows")
    assert _plan({"use_dp_batch_balance": False, "guarantee_order": True}).summary().split("; ")[2] == \
        "actor_rollout: 1 x 16 rows/rank"


# ------------------------------------------------------------------ TP against the model's sizes


def _model(**keys):
    """A model section (num_layers set): llama-shaped unless keys name another family."""
    return {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 128, **keys}


def _tp2(**keys):
    return _plan(actor={"tensor_model_parallel_size": 2, **_model(**keys)})


def _tp_refusal(size):
    return f"actor_config.tensor_model_parallel_size=2 does not divide the model's {size}"


@pytest.mark.parametrize("keys, refused", [
    ({"num_attention_heads": 3}, "num_attention_heads=3"),
    ({"group_query_attention": True, "num_query_groups": 3}, "num_query_groups=3"),
    ({"ffn_hidden_size": 129}, "ffn_hidden_size=129"),
    # Qwen3-MoE: no dense MLP to split, heads still split
    ({"num_experts": 4, "ffn_hidden_size": 129}, None),
    ({"num_experts": 4, "num_attention_heads": 3}, "num_attention_heads=3"),
    # DeepSeek-V3: the first_k_dense_replace dense MLPs (HF default 3) and the shared experts split
    ({"multi_latent_attention": True, "ffn_hidden_size": 129}, "ffn_hidden_size=129"),
    ({"multi_latent_attention": True, "ffn_hidden_size": 129, "first_k_dense_replace": 1}, "ffn_hidden_size=129"),
    ({"multi_latent_attention": True, "ffn_hidden_size": 129, "first_k_dense_replace": 0}, None),
    ({"multi_latent_attention": True, "moe_ffn_hidden_size": 129},
     "moe_ffn_hidden_size * n_shared_experts (shared experts)=129"),
    ({"multi_latent_attention": True, "moe_ffn_hidden_size": 129, "n_shared_experts": 2}, None),
    ({"multi_latent_attention": True, "moe_ffn_hidden_size": 129, "n_shared_experts": 0}, None),
    ({"num_experts": 4, "moe_ffn_hidden_size": 129}, None),  # routed experts are never split over TP
])
def test_tp_must_divide_what_the_engine_splits_for_the_family(keys, refused):
    if refused is None:
        assert _tp2(**keys).layout.tp == 2
    else:
        with pytest.raises(PlanError) as info:
            _tp2(**keys)
        assert str(info.value) == _tp_refusal(refused)


@pytest.mark.parametrize("splits", [True, False])
def test_deepseek_heads_count_only_where_transformers_splits_mla(monkeypatch, splits):
    """Whether the installed transformers' DeepSeek-V3 plan splits MLA by heads (5.25 on) decides; both answers
    stand in for the installed one here."""
    from mindspeed_rl.plan import run_plan
    asked = []
    monkeypatch.setattr(layout, "family_splits_attention", lambda family: asked.append(family) or splits)
    if splits:
        with pytest.raises(PlanError) as info:
            _tp2(multi_latent_attention=True, num_attention_heads=3)
        assert str(info.value) == _tp_refusal("num_attention_heads=3")
    else:
        assert _tp2(multi_latent_attention=True, num_attention_heads=3).layout.tp == 2
    assert asked == ["deepseek_v3"]
    # other families never ask: their heads always split
    asked.clear()
    with pytest.raises(PlanError):
        _tp2(num_attention_heads=3)
    assert asked == []


def test_whether_mla_splits_is_asked_of_the_familys_own_config():
    from transformers import AutoConfig
    from mindspeed_rl.plan import run_plan
    from mindspeed_rl.models.sharding import splits_attention
    for family in ("deepseek_v3", "qwen2"):
        assert layout.family_splits_attention(family) == splits_attention(AutoConfig.for_model(family))
    assert layout.family_splits_attention("qwen2") is True


def test_sizes_are_not_checked_without_tp_or_without_a_model_section():
    odd = {"num_attention_heads": 3, "ffn_hidden_size": 129}
    assert _plan(actor=_model(**odd)).layout.tp == 1
    assert _plan(actor={"tensor_model_parallel_size": 2, "num_attention_heads": 3}).layout.tp == 2  # no num_layers
    assert _tp2(ffn_hidden_size=None).layout.tp == 2  # a size not given is not checked


def test_the_critics_sizes_name_critic_config():
    with pytest.raises(PlanError) as info:
        _plan(critic={"tensor_model_parallel_size": 2, **_model(num_attention_heads=3)}, ppo=True)
    assert str(info.value) == ("critic_config.tensor_model_parallel_size=2 does not divide the model's "
                               "num_attention_heads=3")


# ------------------------------------------------------------------ features the stage table reads


def test_features_follow_the_configs():
    feats = _plan({"init_kl_coef": 0.0}).features
    assert (feats.kl_in_loss, feats.kl_in_reward, feats.critic, feats.dynamic_sampling) == (False, False, False, False)
    assert feats.estimator == "group_norm" and not feats.on_policy
    assert _plan({"init_kl_coef": 0.01}).features.kl_in_loss
    # on-policy: one mini-batch of the train batch, one epoch; the train batch is the filter's under DAPO
    assert _plan({"mini_batch_size": 8}).features.on_policy
    assert not _plan({"mini_batch_size": 8, "epochs": 2}).features.on_policy
    dapo = _plan(_filter(filter_groups_train_batch_size=4), {}).features
    assert dapo.dynamic_sampling and dapo.on_policy  # mini-batch 4 prompts = the 4 kept prompts
    assert not _plan(_filter(filter_groups_train_batch_size=8, filter_groups_max_batches=1)).features.on_policy


def test_rollout_log_probs_follow_the_rollout_backend():
    hf = _plan(gen={"rollout_backend": "hf"})
    assert hf.features.rollout_log_probs is False
    assert hf.stages["actor_rollout"].outputs == ("responses", "response_length")
    plan_needs_vllm()  # a vLLM plan is refused where vLLM is not installed
    vllm = _plan(gen={"rollout_backend": "vllm"})
    # vLLM's rollout also writes its log-probs, transformers' generate does not
    assert vllm.features.rollout_log_probs is True
    assert vllm.stages["actor_rollout"].outputs == ("responses", "response_length", "rollout_log_probs")


def test_the_critics_update_dispatch_size_is_judged_in_the_critics_layout():
    # critic on 4 devices: 4 rows per optimizer step and rank; the actor's DP 2 would give 8
    with pytest.warns(UserWarning) as caught:
        _plan({"critic_resource": {"num_npus": 4}, "critic_update_dispatch_size": 8}, ppo=True)
    assert [str(w.message) for w in caught] == [
        "rl_config.critic_update_dispatch_size=8 only sizes upstream's update fetches: each optimizer step here "
        "trains on mini_batch_size // DP = 4 rows per rank (DP=4), the same mini-batches"]
    assert _refused({"critic_resource": {"num_npus": 4}, "critic_update_dispatch_size": 6}, ppo=True) == (
        "rl_config.critic_update_dispatch_size=6 is not a multiple of the rows a rank trains per optimizer step in "
        "the config's layout (mini_batch_size // DP = 4): upstream would train on uneven mini-batches; give a "
        "multiple of 4 or leave it unset")


def test_the_critics_worker_spec_names_critic_config():
    cfgs = _configs({"use_dynamic_bsz": True, "max_packing_token_size": 64}, ppo=True)
    cfgs[3].micro_batch_size = 0
    with pytest.raises(ValueError) as info:
        build_run_plan(*cfgs)
    assert str(info.value).startswith("critic_config.micro_batch_size=0 must be an int > 0 or unset")


# ------------------------------------------------------------------ driver stages and roles


def test_driver_stages_take_the_whole_round_unbalanced():
    plan = _plan({"use_dp_batch_balance": True})
    for name in ("rule_reward", "compute_advantage"):
        stage = plan.stages[name]
        assert not stage.is_dp and stage.kind == "driver"
        assert (stage.rows_per_share, stage.shares_per_rank, stage.balanced) == (32, 1, False)
        assert stage.planned_rows == 32
    assert plan.stages["rule_reward"].outputs == ("rm_scores",)
    # under DAPO the reward also writes the filter's metric column, which the filter reads
    dapo = _plan(_filter())
    assert dapo.stages["rule_reward"].outputs == ("rm_scores", table.FILTER_METRIC)
    assert table.FILTER_METRIC in dapo.stages[table.FILTER.name].inputs


def test_a_stage_on_a_role_without_a_group_names_the_groups_there_are(monkeypatch):
    import dataclasses
    probe = dataclasses.replace(table.OLD, name="judge_probe", role="judge")
    monkeypatch.setattr(table, "STAGES", tuple(table.STAGES) + (probe,))
    assert _refused() == ("stage 'judge_probe' runs on role 'judge', which has no worker group in this run "
                          "(groups: ['actor', 'ref'])")
    assert _refused(ppo=True).endswith("(groups: ['actor', 'ref', 'critic'])")


def test_the_dr_grpo_switch_must_be_a_bool_and_gae_keys_are_checked_for_ppo_only():
    assert _refused_set("rl", "norm_adv_by_std_in_grpo", "no") == \
        "rl_config.norm_adv_by_std_in_grpo='no' must be true or false"
    assert _plan({"lam": 2.0}).advantage.lam == 2.0  # GRPO reads no lam: not refused
    assert _refused({"gamma": 2.0}) == "rl_config.gamma=2.0 must be a number in [0, 1]"  # REINFORCE++'s discount
