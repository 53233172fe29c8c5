"""The run plan, the declared table of unimplemented keys and the model keys."""
import re
import warnings
from pathlib import Path

import pytest

from mindspeed_rl.config_cls import GenerateConfig, MegatronConfig, RLConfig
from mindspeed_rl.plan import ConfigError, build_configs, load_config
from mindspeed_rl.config_cls import model_arch, unimplemented
from mindspeed_rl.config_cls.generate_config import SAMPLING_DEFAULTS

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "configs" / "grpo_tiny_cpu.yaml"


def _build(*overrides):
    return build_configs(load_config(TINY, list(overrides)))


def test_tiny_plan_numbers():
    plan = _build().plan
    assert (plan.layout.world_size, plan.layout.dp, plan.layout.tp) == (2, 2, 1)
    assert plan.rows_per_round == 32 and plan.mini_batches == 2
    assert list(plan.stages) == ["actor_rollout", "rule_reward", "compute_advantage", "ref_log_prob",
                                 "actor_log_prob", "actor_train"]
    assert [s.name for s in plan.dp_stages] == ["actor_rollout", "ref_log_prob", "actor_log_prob", "actor_train"]
    train = plan.stages["actor_train"]
    assert (train.rows_per_share, train.shares_per_rank, train.balanced) == (8, 2, True)
    # the update reads what the stages before it wrote
    assert {"advantages", "old_log_prob", "ref_log_prob"} <= set(train.inputs)
    reward = plan.stages["rule_reward"]
    assert not reward.is_dp and reward.rows_per_share == 32 and set(reward.outputs) == {"rm_scores"}
    assert plan.stages["compute_advantage"].outputs == ("advantages",)
    assert not plan.stages["actor_rollout"].balanced  # rollout lengths are unknown before it runs
    assert plan.optimizer_steps == 4 * 2 * 1
    assert plan.balance is not None and plan.balance.objective == "tokens"


def test_plan_follows_configs():
    plan = _build("rl_config.use_dp_batch_balance=false", "rl_config.init_kl_coef=0.0",
                  "rl_config.mini_batch_size=8", "actor_config.tensor_model_parallel_size=2").plan
    assert plan.balance is None and not plan.uses_reference
    assert not plan.computes_old_log_prob  # one mini-batch, one epoch
    assert (plan.layout.dp, plan.layout.tp) == (1, 2)
    assert not plan.stages["actor_train"].balanced and plan.stages["actor_train"].rows_per_share == 32
    assert not {"old_log_prob", "ref_log_prob"} & set(plan.stages["actor_train"].inputs)
    assert _build("rl_config.epochs=2").plan.optimizer_steps == 4 * 2 * 2


def test_no_stage_name_literal_outside_the_stage_table():
    """Stage names live in plan/stages.py; the core modules name stages through it."""
    from mindspeed_rl.plan.stages import STAGES
    # (trainer/driver_stages.py registers the rows' functions under their method names, some of which are stage
    # names too: it is not in the list)
    core = ["trainer/stage_trainer.py", "data/driver_dock.py", "trainer/utils/reward_stage.py",
            "trainer/dynamic_sampling.py", "trainer/partial_rollout.py", "workers/integrated_worker.py", "workers/base_worker.py", "workers/scheduler/launcher.py",
            "plan/run_plan.py"]
    for path in core:
        text = (ROOT / "mindspeed_rl" / path).read_text()
        for stage in STAGES:
            assert f'"{stage.name}"' not in text and f"'{stage.name}'" not in text, (path, stage.name)


def test_flops_plan_has_the_model_workload():
    spec = _build("rl_config.dp_balance_objective=flops").plan.balance
    assert spec.workload is not None and spec.workload.quadratic > 0


def test_pipeline_parallel_that_does_not_divide_the_devices_is_an_error():
    with pytest.raises(ValueError, match="tensor x pipeline x context parallel"):
        _build("actor_config.pipeline_model_parallel_size=3")  # PP=2 runs folded into DP: test_upstream_configs


# ---------------------------------------------------------------- unimplemented keys

def test_table_key_warns_with_what_happens_instead():
    with pytest.warns(UserWarning, match=r"rl_config.num_samples_per_step=4 is not implemented: no effect"):
        _build("rl_config.num_samples_per_step=4")


def test_table_key_that_changes_results_is_an_error():
    with pytest.raises(ValueError, match="adv_estimator"):
        _build("rl_config.adv_estimator=gae")
    with pytest.raises(ConfigError, match="use_integrated_worker"):
        _build("rl_config.use_integrated_worker=false")


def test_shipped_tiny_config_warns_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _build()


def test_load_without_finetune_is_an_error_and_with_finetune_names_weights(tmp_path):
    with pytest.raises(ConfigError, match="megatron_training.load"):
        _build(f"megatron_training.load={tmp_path}")
    run = _build(f"megatron_training.load={tmp_path}", "megatron_training.finetune=true")
    assert run.actor_config.model_path == str(tmp_path)


def _read_outside_config(key, texts):
    # attribute reads (not method calls or module imports) or item reads
    pattern = re.compile(r"(\.%s\b(?!\s*\()(?!\s+import)|\[[\"']%s[\"']\])" % (key, key))
    return any(pattern.search(t) for t in texts)


def test_every_key_does_something_or_is_declared():
    """Each accepted key is read by code outside its class file, is an
    architecture key, or sits in the unimplemented table (and then no
    consumer outside config_cls reads it)."""
    pkg = ROOT / "mindspeed_rl"
    skip = {"base_config.py", "rl_config.py", "megatron_config.py", "generate_config.py",
            "unimplemented.py"}
    files = [p for p in list(pkg.rglob("*.py")) + list((ROOT / "cli").glob("*.py")) if p.name not in skip]
    texts = [p.read_text() for p in files]
    # plan/loader.py and plan/validate.py check keys (and write upstream's derived copies back): not consumers
    consumers = [p.read_text() for p in files
                 if p.parent.name != "config_cls" and p.name not in ("validate.py", "loader.py")]
    declared = {k.name for k in unimplemented.KEYS}
    keys = set(RLConfig().dict()) | set(MegatronConfig().dict()) | set(GenerateConfig().dict()) | set(SAMPLING_DEFAULTS)
    from mindspeed_rl.plan.stages import STAGES  # the worker reads these through the stage table
    table = {k for s in STAGES for k in (s.micro_batch_key, s.dispatch_key) if k}
    from mindspeed_rl.config_cls.rl_config import KEY_ALIASES  # upstream's names, resolved in rl_config
    inert = sorted(k for k in keys - declared - set(model_arch.ARCH_KEYS) - table
                   if not _read_outside_config(KEY_ALIASES.get(k, k), texts))
    assert inert == []
    # names that are also common attributes (tensor.dtype, engine.optimizer) or module
    # paths in lazy-export tables ("mindspeed_rl.workers.rule_reward") cannot be told apart here
    # ("stage": StagePlan.stage; "tokenizer_type": the dataset recipe's own key; "spec": the agent loop's
    # MultiTurnSpec; "num_workers": a tool's own config key)
    collide = {"dtype", "optimizer", "rule_reward", "stage", "tokenizer_type", "spec", "num_workers"}
    # keys declared for the hf rollout backend only are read by the vLLM backend
    by_backend = {k.name for k in unimplemented.KEYS if k.applies is unimplemented._hf}
    # keys declared for group_norm runs only are read by PPO's GAE and critic
    by_backend |= {k.name for k in unimplemented.KEYS if k.applies is unimplemented._group_norm}
    # keys declared for runs without wandb are read by the wandb logger
    by_backend |= {k.name for k in unimplemented.KEYS if k.applies is unimplemented._no_wandb}
    assert {"max_num_seqs", "enable_prefix_caching", "logprobs", "wandb_project"} <= by_backend
    stale = sorted(k for k in declared - collide - by_backend if _read_outside_config(k, consumers))
    assert stale == []


# ---------------------------------------------------------------- model keys

def test_model_keys_build_the_tiny_checkpoint(tmp_path):
    from mindspeed_rl.models.tiny_model import build_tiny_checkpoint
    from transformers import AutoConfig
    actor = _build().actor_config
    path = build_tiny_checkpoint(tmp_path / "m", **model_arch.hf_config_kwargs(actor))
    cfg = AutoConfig.from_pretrained(path)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_key_value_heads) == (2, 64, 2)
    assert cfg.tie_word_embeddings is True  # tiny_qwen2.yaml: untie_embeddings_and_output_weights: false
    model_arch.check_against_checkpoint(actor, path)
    actor.untie_embeddings_and_output_weights = True
    with pytest.raises(ValueError, match="tie_word_embeddings=False"):
        model_arch.check_against_checkpoint(actor, path)


def test_model_key_the_hf_model_cannot_take_is_refused():
    with pytest.raises(ConfigError, match="normalization"):
        _build("model.tiny_qwen2.normalization=LayerNorm")


@pytest.mark.parametrize("override,suggestion", [("rl.use_dp_batch_balance=false", "rl_config"),
                                                 ("rl_confg.seed=3", "rl_config")])
def test_unknown_section_is_an_error_with_a_suggestion(override, suggestion):
    with pytest.raises(ConfigError, match=rf"unknown section .*did you mean '{suggestion}'"):
        load_config(TINY, [override])


def test_typo_section_in_the_file_is_an_error(tmp_path):
    text = TINY.read_text().replace("rl_config:", "rl_confg:")
    path = tmp_path / "typo.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="unknown section 'rl_confg'"):
        load_config(path)


def test_upstream_only_sections_warn():
    with pytest.warns(UserWarning, match="profiler_config"):
        build_configs(load_config(ROOT / "tests/st/configs/test_grpo_trainer_qwen25_7b_integrated.yaml"))


def test_readme_command_prints_the_table_without_runpy_warning():
    """`python -m mindspeed_rl.config_cls.unimplemented` (the command in docs/reference/configuration.md) runs the module fresh."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "mindspeed_rl.config_cls.unimplemented"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "RuntimeWarning" not in out.stderr
    assert out.stdout.strip() == unimplemented.markdown_table().strip()
