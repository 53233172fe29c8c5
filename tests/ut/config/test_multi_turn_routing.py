"""rl_config.multi_turn_routing: which engine runs a conversation's next turn. 'free' needs the vLLM queue (one
line otherwise); the plan says the routing and tells the launcher to load its queue with handoff."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, ROOT)
from cli.train_grpo import main  # noqa: E402
from mindspeed_rl.plan import build_configs, load_config  # noqa: E402
from mindspeed_rl.plan.multi_turn import DEFAULT_ROUTING  # noqa: E402

TINY = os.path.join(ROOT, "configs", "grpo_tiny_cpu.yaml")
TOOLS = ["megatron_training.model_path=/unused", "rl_config.multi_turn_enable=true",
         f"rl_config.tool_config_path={os.path.join(ROOT, 'configs', 'tools', 'toy_secret.yaml')}",
         "rl_config.max_total_response_length=8", "generate_config.sampling_config.max_tokens=2",
         "rl_config.max_parallel_calls=1"]
# vLLM's CPU attention needs a head size of 32 or more
VLLM = ["generate_config.rollout_backend=vllm", "generate_config.dtype=float32",
        "megatron_training.num_attention_heads=2", "megatron_training.num_query_groups=2"]


def _plan(*overrides):
    return build_configs(load_config(TINY, [*TOOLS, *overrides])).plan


def test_free_routing_on_vllm_loads_the_queue_with_handoff():
    plan = _plan(*VLLM, "rl_config.multi_turn_routing=free")
    assert plan.multi_turn.routing == "free" and plan.rollout_handoff
    assert plan.multi_turn.describe().endswith("; free routing of the turn after a tool round")
    sticky = _plan(*VLLM, "rl_config.multi_turn_routing=sticky")
    assert sticky.multi_turn.routing == "sticky" and not sticky.rollout_handoff
    assert _plan(*VLLM).multi_turn.routing == DEFAULT_ROUTING == "sticky"  # what the benchmark measured better
    # where the queue cannot hand turns off, the default is sticky (no error)
    assert _plan("generate_config.rollout_backend=hf").multi_turn.routing == "sticky"
    assert _plan(*VLLM, "rl_config.guarantee_order=true").multi_turn.routing == "sticky"
    assert _plan("generate_config.rollout_backend=hf").multi_turn.describe().endswith(
        "; sticky routing of the turn after a tool round")


@pytest.mark.parametrize("overrides,line", [
    (["generate_config.rollout_backend=hf", "rl_config.multi_turn_routing=free"],
     "error: rl_config.multi_turn_routing='free' hands a conversation's next turn to another vLLM engine through "
     "the rollout queue; this run uses transformers generate, which runs a take's turns together (set "
     "generate_config.rollout_backend=vllm, or multi_turn_routing=sticky)"),
    ([*VLLM, "rl_config.multi_turn_routing=free", "rl_config.guarantee_order=true"],
     "error: rl_config.multi_turn_routing='free' hands a conversation's next turn to another vLLM engine through "
     "the rollout queue; this run serves fixed shares (rl_config.rollout_balance=static, upstream's "
     "guarantee_order=true): set rollout_balance=queue, or multi_turn_routing=sticky"),
    (["rl_config.multi_turn_routing=fre"],
     "error: rl_config.multi_turn_routing='fre' is not one of ['sticky', 'free'] (did you mean 'free'?)"),
])
def test_a_routing_the_run_cannot_do_is_one_line(capsys, overrides, line):
    assert main(["--config", TINY, "--dry-run", *TOOLS, *overrides]) == 2
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1


def test_ppo_with_multi_turn_reads_the_loss_mask_in_its_kl_gae_and_critic_stages():
    ppo = os.path.join(ROOT, "configs", "ppo_tiny_cpu.yaml")
    plan = build_configs(load_config(ppo, [*TOOLS, "rl_config.use_kl_in_reward=true"])).plan
    for name in ("compute_kl", "compute_advantage", "critic_train", "actor_train"):
        assert "loss_mask" in plan.stages[name].inputs, name
    plain = build_configs(load_config(ppo, ["megatron_training.model_path=/unused",
                                            "rl_config.use_kl_in_reward=true"])).plan
    assert all("loss_mask" not in s.inputs for s in plain.stages.values())
