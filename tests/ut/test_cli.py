"""cli/train_grpo.py: fast --help, one-line errors before Ray starts."""
import os
import subprocess
import sys

import pytest
import ray

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from cli.train_grpo import main  # noqa: E402

TINY = os.path.join(ROOT, "configs", "grpo_tiny_cpu.yaml")


def test_help_imports_neither_torch_nor_ray():
    code = ("import sys; sys.path.insert(0, 'cli'); import train_grpo\n"
            "try:\n    train_grpo.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules, 'ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("False False")
    assert "--tiny-model-dir" in out.stdout and "config overrides" in out.stdout


@pytest.fixture
def tiny_dir(tmp_path_factory):
    from mindspeed_rl.models.tiny_model import build_tiny_checkpoint
    return build_tiny_checkpoint(tmp_path_factory.mktemp("m") / "model")


@pytest.mark.parametrize("args,message", [
    ([], "megatron_training.model_path is not set"),
    (["rl.use_dp_batch_balance=false"], "did you mean 'rl_config'"),
    (["megatron_training.train_iters=0"], "train_iters must be a positive int"),
    (["actor_config.pipeline_model_parallel_size=3"], "must be divisible by tensor x pipeline x context parallel"),
])
def test_config_errors_are_one_line_exit_2(capsys, args, message):
    assert main(["--config", TINY, *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not ray.is_initialized()


def test_model_and_data_errors_name_the_folder_or_task(capsys, tmp_path, tiny_dir):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["--config", TINY, f"megatron_training.model_path={empty}"]) == 2
    assert f"model folder '{empty}' lacks config.json" in capsys.readouterr().err
    assert main(["--config", TINY, f"megatron_training.model_path={tiny_dir}",
                 "megatron_training.data_path=toy:lenght"]) == 2
    assert "unknown toy task 'lenght'" in capsys.readouterr().err
    assert not ray.is_initialized()


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(ValueError, match="model_path is not set"):
        main(["--config", TINY, "--debug"])


def test_tokenizer_folder_problems_name_the_key(capsys, tmp_path, tiny_dir):
    missing = tmp_path / "no_such_tokenizer"
    assert main(["--config", TINY, f"megatron_training.model_path={tiny_dir}",
                 f"megatron_training.tokenizer_name_or_path={missing}"]) == 2
    err = capsys.readouterr().err
    assert f"megatron_training.tokenizer_name_or_path='{missing}' is not a folder" in err and "Repo id" not in err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["--config", TINY, f"megatron_training.model_path={tiny_dir}",
                 f"megatron_training.tokenizer_name_or_path={empty}"]) == 2
    assert f"tokenizer_name_or_path='{empty}' holds no tokenizer" in capsys.readouterr().err
    # a model folder without a tokenizer of its own is fine when tokenizer_name_or_path names one
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in os.listdir(tiny_dir):
        if not name.startswith(("tokenizer", "special_tokens", "vocab")):
            os.symlink(os.path.join(tiny_dir, name), bare / name)
    assert main(["--config", TINY, f"megatron_training.model_path={bare}"]) == 2
    assert f"model folder '{bare}' lacks a tokenizer" in capsys.readouterr().err
    assert main(["--config", TINY, f"megatron_training.model_path={bare}", f"--output-dir={tmp_path / 'out'}",
                 f"megatron_training.tokenizer_name_or_path={tiny_dir}", "megatron_training.data_path=toy:x"]) == 2
    assert "unknown toy task 'x'" in capsys.readouterr().err  # got past the tokenizer
    assert not ray.is_initialized()


def test_fresh_run_into_a_used_output_dir_stops_before_ray(capsys, tmp_path, tiny_dir, monkeypatch):
    from mindspeed_rl.utils import ray_utils

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started")
    monkeypatch.setattr(ray_utils, "init_ray", no_ray)
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"iteration": 1}\n{"iteration": 2}\n')
    assert main(["--config", TINY, f"megatron_training.model_path={tiny_dir}", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert f"--output-dir '{out}' already holds another run's metrics.jsonl (iterations 1-2)" in err
    assert not ray.is_initialized()
    assert (out / "metrics.jsonl").read_text() == '{"iteration": 1}\n{"iteration": 2}\n'


def test_help_shows_the_output_dir_default(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "(default: outputs/grpo)" in " ".join(capsys.readouterr().out.split())


UPSTREAM = os.path.join(ROOT, "tests", "data", "upstream_configs")
QWEN3_8B_TINY = [f"model.qwen3_8b.{k}={v}" for k, v in (
    ("num_layers", 2), ("hidden_size", 64), ("ffn_hidden_size", 128), ("num_attention_heads", 4),
    ("num_query_groups", 2), ("padded_vocab_size", 256), ("max_position_embeddings", 256))] + [
    "megatron_training.global_batch_size=4", "megatron_training.seq_length=64", "rl_config.max_prompt_length=32",
    "rl_config.mini_batch_size=4", "rl_config.n_samples_per_prompt=2", "rl_config.actor_resource.num_npus=4",
    "generate_config.max_model_len=64", "generate_config.sampling_config.max_tokens=32"]


def test_dry_run_prints_config_plan_and_memory_without_ray(capsys):
    path = os.path.join(UPSTREAM, "2f84bab", "configs", "grpo_qwen25_7b_A3.yaml")  # upstream's file, unchanged
    assert main(["--config", path, "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert "note: megatron_training.use_fused_rmsnorm=True is not implemented" in out
    assert "model: qwen25_7b: num_layers=28 hidden_size=3584" in out
    assert "layout asked: TP=2 x PP=2 x DP=4; runs: DP=8 x TP=2 (fsdp engine)" in out
    assert "run plan: layout DP=8 TP=2 (16 workers, fsdp engine); 256 rows per round" in out
    assert "memory plan: DP=8 TP=2 (16 devices, fsdp engine), per rank:" in out and "fits: 64 GB yes" in out
    assert out.rstrip().endswith("nothing was started")
    assert err.count("layout: the config asks for TP=2 x PP=2 x DP=4") == 1
    assert not ray.is_initialized()


def test_dry_run_of_upstream_qwen3_8b_shrunk_by_overrides(capsys):
    path = os.path.join(UPSTREAM, "05a90d7", "configs", "grpo_qwen3_8b_A3.yaml")
    rc = main(["--config", path, "--dry-run", *QWEN3_8B_TINY])
    out, err = capsys.readouterr()
    assert rc == 0, err  # the Qwen3 family is built: any refusal here is a failure
    assert "qk_layernorm=True" in out and "layout asked: TP=2 x PP=2 x DP=1; runs: DP=2 x TP=2" in out
    assert "run plan: layout DP=2 TP=2 (4 workers, fsdp engine); 8 rows per round" in out
    assert not ray.is_initialized()


def test_dry_run_names_the_algorithm_before_the_plan(capsys):
    assert main(["--config", TINY, "--dry-run", "megatron_training.stage=ray_dapo"]) == 0
    out = capsys.readouterr().out
    assert out.index("algorithm: DAPO (megatron_training.stage=ray_dapo): ") < out.index("run plan:")


def test_dry_run_config_error_is_one_line_exit_2(capsys):
    assert main(["--config", TINY, "--dry-run", "rl_config.use_dp_batch_balanse=true"]) == 2
    err = capsys.readouterr().err
    assert err == "error: rl_config: unknown key 'use_dp_batch_balanse'; did you mean 'use_dp_batch_balance'?\n"


def test_save_folder_under_a_regular_file_stops_before_ray(capsys, tmp_path, tiny_dir, monkeypatch):
    from mindspeed_rl.utils import ray_utils

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started")
    monkeypatch.setattr(ray_utils, "init_ray", no_ray)
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    capsys.readouterr()
    assert main(["--config", TINY, f"megatron_training.model_path={tiny_dir}", "--output-dir",
                 str(tmp_path / "out"), f"megatron_training.save={blocker / 'ckpt'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "a_file" in err
    assert not ray.is_initialized()


def test_dry_run_says_which_rollout_backend_runs_and_why(capsys, monkeypatch):
    from mindspeed_rl.plan import rollout_spec
    monkeypatch.setattr(rollout_spec, "vllm_version", lambda: None)
    assert main(["--config", TINY, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "rollout: transformers generate (generate_config.rollout_backend=hf" in out
    # asking for vLLM where it is not installed stops before Ray with one line naming the extra
    assert main(["--config", TINY, "--dry-run", "generate_config.rollout_backend=vllm"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: generate_config.rollout_backend=vllm cannot run: vLLM is not installed; "
                          "install it with `bash scripts/install.sh vllm`") and err.count("\n") == 1
    assert not ray.is_initialized()


def test_the_reward_takes_rl_configs_verifiers_pool_and_timeout():
    from cli.train_grpo import make_reward
    from mindspeed_rl.plan import build_configs, load_config
    from mindspeed_rl.models.tiny_model import build_toy_tokenizer
    rl = build_configs(load_config(TINY, ["megatron_training.model_path=/unused", "rl_config.verifier_timeout=7",
                                          "rl_config.verifier_parallel=3", "rl_config.verifier_function=[acc,format]",
                                          "rl_config.verifier_weight=[1.0,0.5]"])).rl_config
    reward = make_reward(rl, build_toy_tokenizer(), eos_id=2)
    try:
        assert (reward.pool.processes, reward.pool.timeout) == (3, 7.0)
        assert list(reward.verifier_function) == ["acc", "format"] and list(reward.verifier_weight) == [1.0, 0.5]
    finally:
        reward.close()


def test_a_max_model_len_past_the_models_positions_stops_before_ray_with_vllm(capsys, tmp_path, monkeypatch):
    from mindspeed_rl.plan import rollout_spec
    from mindspeed_rl.utils import ray_utils

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started")
    monkeypatch.setattr(ray_utils, "init_ray", no_ray)
    monkeypatch.setattr(rollout_spec, "vllm_version", lambda: "0.0-test")  # as if vLLM were installed
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    model = tmp_path / "model"
    args = ["--config", TINY, "--tiny-model-dir", str(model), "--output-dir", str(tmp_path / "out"),
            "generate_config.rollout_backend=vllm", "megatron_training.num_attention_heads=2",
            "megatron_training.num_query_groups=2", "generate_config.max_model_len=128"]
    tail = ": vLLM cannot serve it; lower generate_config.max_model_len\n"
    # the model section's limit, found with the config: no checkpoint is built
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err == "error: generate_config.max_model_len=128 exceeds the model's max_position_embeddings=64 " \
                  "(the model section)" + tail
    assert not model.exists()
    # a section without the key: the limit of the checkpoint's config.json, once it is built
    assert main(args + ["model.tiny_qwen2.max_position_embeddings=null"]) == 2
    captured = capsys.readouterr()
    assert captured.err == "error: generate_config.max_model_len=128 exceeds the model's max_position_embeddings=64 " \
                           f"({model / 'config.json'})" + tail
    # max_num_seqs is left at 1: its one warning line came first
    assert [l for l in captured.out.splitlines() if l.startswith("warning: generate_config.max_num_seqs")] == [
        "warning: generate_config.max_num_seqs=1 with the vLLM backend: each engine runs one request at a time, so "
        "its rows are decoded one after another with no batching and it takes one row at a time from the rollout "
        "queue; raise it (e.g. to the rows an engine takes per iteration) to batch rows within an engine"]
    assert not ray.is_initialized()


def test_use_wandb_without_wandb_stops_before_ray_naming_the_install(capsys, tmp_path, tiny_dir, monkeypatch):
    from mindspeed_rl.utils import ray_utils
    from mindspeed_rl.utils.wandb_log import INSTALL

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started")
    monkeypatch.setattr(ray_utils, "init_ray", no_ray)
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed: import wandb fails
    line = f"error: rl_config.use_wandb: true needs the wandb package, which is not installed: {INSTALL}\n"
    capsys.readouterr()
    for extra in (["--dry-run"], [f"megatron_training.model_path={tiny_dir}", "--output-dir", str(tmp_path / "o")]):
        assert main(["--config", TINY, "rl_config.use_wandb=true", *extra]) == 2
        assert capsys.readouterr().err == line
    assert not (tmp_path / "o").exists() and not ray.is_initialized()
    # a wandb key while use_wandb is off does nothing, and says so
    assert main(["--config", TINY, "--dry-run", "rl_config.wandb_project=p"]) == 0
    assert "note: rl_config.wandb_project='p' is not implemented: no effect while rl_config.use_wandb is false" \
        in capsys.readouterr().out
