"""memory_plan: per-rank bytes of the shipped 7B configs, fit verdicts, errors."""
import pytest

from mindspeed_rl.plan import build_configs, load_config
from mindspeed_rl.reports.memory_plan import GB, main, plan_memory

A3 = "configs/grpo_qwen25_7b_A3.yaml"
TEST_7B = "tests/st/configs/test_grpo_trainer_qwen25_7b_integrated.yaml"


def test_shipped_7b_configs_fit_64gb(capsys):
    assert main(["--config", A3, TEST_7B, "--device-gb", "64", "80", "141"]) == 0
    out = capsys.readouterr().out
    assert out.count("fits: 64 GB yes, 80 GB yes, 141 GB yes") == 2
    assert "DP=4 TP=4 (16 devices, fsdp engine)" in out and "DP=2 TP=4 (8 devices, fsdp engine)" in out


def test_sharding_divides_state_and_replicas_do_not_fit():
    sharded = plan_memory(build_configs(load_config(A3)))
    replica = plan_memory(build_configs(load_config(A3, [
        "actor_config.tensor_model_parallel_size=1", "megatron_training.use_distributed_optimizer=false"])))
    # 7.6 B parameters x 16 bytes on every rank without sharding
    assert replica.params + replica.grads + replica.optimizer > 110 * GB
    assert replica.total > 141 * GB
    # DP 4 x TP 4: the TP-split layers shrink 16x, embedding and LM head 4x
    assert sharded.params < replica.params / 10


def test_too_small_device_exits_one_and_bad_config_two(capsys, tmp_path):
    assert main(["--config", TEST_7B, "--device-gb", "16"]) == 1
    assert "16 GB NO" in capsys.readouterr().out
    assert main(["--config", str(tmp_path / "missing.yaml")]) == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("overrides,match", [
    (["actor_config.tensor_model_parallel_size=3", "rl_config.actor_resource.num_npus=3"], "num_attention_heads"),
    (["actor_config.tensor_model_parallel_size=4", "rl_config.actor_resource.num_npus=4"], "num_query_groups"),
    (["megatron_training.use_distributed_optimizer=true", "actor_config.tensor_model_parallel_size=2"],
     "use_distributed_optimizer"),
])
def test_layout_errors_name_the_key(overrides, match):
    with pytest.raises(ValueError, match=match):
        build_configs(load_config("configs/grpo_tiny_cpu.yaml", overrides))


def test_overrides_anywhere_on_the_command_line(capsys):
    from mindspeed_rl.reports.memory_plan import parse_args
    override = "actor_config.tensor_model_parallel_size=2"
    for argv in (["--config", A3, "--device-gb", "64", "80", override],
                 [override, "--config", A3, "--device-gb", "64", "80"],
                 ["--config", A3, override, "--device-gb", "64", "80"]):
        args = parse_args(argv)
        assert args.overrides == [override] and args.config == [A3] and args.device_gb == [64.0, 80.0], argv
    # and the override is applied: TP=2 instead of the config's TP=4
    main(["--config", A3, "--device-gb", "64", override])
    assert "TP=2" in capsys.readouterr().out


TINY = "configs/grpo_tiny_cpu.yaml"
UNKNOWN_O_PROJ = {
    "layers.*.self_attn.q_proj": "colwise", "layers.*.self_attn.k_proj": "colwise",
    "layers.*.self_attn.v_proj": "colwise", "layers.*.self_attn.o_proj": "future_style",
    "layers.*.mlp.gate_proj": "colwise", "layers.*.mlp.up_proj": "colwise", "layers.*.mlp.down_proj": "rowwise",
}
O_PROJ_LINE = ("tensor parallel: Qwen2 layers.*.self_attn.o_proj style 'future_style' is not applied by this "
               "engine; the module stays replicated over tp")


def _tiny(tp):
    return [f"rl_config.actor_resource.num_npus={2 * tp}", f"actor_config.tensor_model_parallel_size={tp}",
            "megatron_training.use_distributed_optimizer=true"]


def test_unknown_tp_style_is_planned_replicated_and_listed(monkeypatch, capsys):
    from transformers import Qwen2Config
    known = plan_memory(build_configs(load_config(TINY, _tiny(2))))
    monkeypatch.setattr(Qwen2Config, "base_model_tp_plan", UNKNOWN_O_PROJ)
    cfgs = build_configs(load_config(TINY, _tiny(2)))  # no error
    plan = plan_memory(cfgs)
    assert O_PROJ_LINE in plan.replicated
    # the attention block stays whole on both tp ranks: more bytes than with the known plan
    assert plan.params > known.params
    assert main(["--config", TINY, *_tiny(2)]) == 0
    assert f"  {O_PROJ_LINE}\n" in capsys.readouterr().out
    # nothing is split over tp with TP=1: no lines
    assert plan_memory(build_configs(load_config(TINY, _tiny(1)))).replicated == ()


def test_dry_run_lists_what_runs_replicated_over_tp(monkeypatch):
    import os
    from transformers import Qwen2Config
    monkeypatch.syspath_prepend(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))))
    from cli.train_grpo import dry_run
    monkeypatch.setattr(Qwen2Config, "base_model_tp_plan", UNKNOWN_O_PROJ)
    text = "\n".join(dry_run(TINY, _tiny(2)))
    assert O_PROJ_LINE in text
    assert "layers.*.self_attn.q_proj style 'colwise' is not applied: layers.*.self_attn.o_proj in the same " \
           "block has style 'future_style'" in text


def test_the_old_module_path_still_runs_the_report():
    # the report moved to mindspeed_rl.reports; mindspeed_rl.tools is upstream's agent-tool package now
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "mindspeed_rl.tools.memory_plan", "--config", A3, "--device-gb",
                           "64"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "fits: 64 GB yes" in proc.stdout
    from mindspeed_rl.tools import memory_plan as old
    assert old.plan_memory is plan_memory
