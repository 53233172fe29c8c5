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
    (["actor_config.pipeline_model_parallel_size=2"], "pipeline_model_parallel_size=2 is not implemented"),
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
