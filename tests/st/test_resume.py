"""Reproducible and resumable runs through the CLI's run() (CPU, tiny model, DP=2)."""
import glob
import os
import shutil
import sys

import pytest
from transformers import AutoConfig, AutoTokenizer

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from cli.train_grpo import run  # noqa: E402
from mindspeed_rl.plan import ConfigError, build_configs, load_config  # noqa: E402
from mindspeed_rl.utils.checkpoint import TRACKER, CheckpointError, find  # noqa: E402

CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "grpo_tiny_cpu.yaml")
KEYS = ("reward/mean", "actor/pg_loss", "actor/kl", "actor/grad_norm", "actor/lr", "response_length/mean",
        "dp_balance/actor_train/rank_imbalance")


def _numbers(history):
    return [{k: m[k] for k in KEYS} for m in history]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tiny") / "model")


def _straight(tmp, tiny_model, *extra):
    """3 iterations, checkpoints at 2 and 3 (the last), cosine LR (so the resumed LR step matters)."""
    save = os.path.join(tmp, "ckpt")
    overrides = ["megatron_training.train_iters=3", f"megatron_training.save={save}",
                 "megatron_training.save_interval=2", "actor_config.lr_decay_style=cosine",
                 "actor_config.min_lr=1.0e-4", *extra]
    return run(CONFIG, overrides, os.path.join(tmp, "a"), tiny_model), save, overrides


@pytest.fixture(scope="module")
def straight_ddp(tiny_model, tmp_path_factory):
    """The DDP straight run, shared by the tests that only read it (its checkpoints and its HF export)."""
    return _straight(str(tmp_path_factory.mktemp("straight_ddp")), tiny_model)


def test_same_config_gives_identical_metrics(straight_ddp, tiny_model, tmp_path):
    first, _, overrides = straight_ddp
    second = run(CONFIG, overrides + [f"megatron_training.save={tmp_path}/ckpt"], str(tmp_path / "two"), tiny_model)
    assert _numbers(first) == _numbers(second)  # bit for bit on CPU


@pytest.mark.parametrize("engine", ["ddp", "fsdp"])
def test_resume_continues_exactly(straight_ddp, tiny_model, tmp_path, engine):
    if engine == "fsdp":
        straight, save, overrides = _straight(str(tmp_path), tiny_model,
                                              "megatron_training.use_distributed_optimizer=true")
    else:
        straight, save, overrides = straight_ddp
    assert open(os.path.join(save, TRACKER)).read().strip() == "3"
    assert os.path.isdir(os.path.join(save, "iter_0000002")) and os.path.isdir(os.path.join(save, "iter_0000003"))
    resumed = run(CONFIG, overrides + [f"megatron_training.load={save}/iter_0000002",
                                       f"megatron_training.save={tmp_path}/ckpt_b"],
                  str(tmp_path / "b"), tiny_model)
    assert len(resumed) == 1
    assert _numbers(resumed) == _numbers(straight[2:])


def test_resume_without_optimizer_state_differs(straight_ddp, tiny_model, tmp_path):
    """The optimizer state really is restored: leaving it out changes iteration 3."""
    straight, save, overrides = straight_ddp
    fresh = run(CONFIG, overrides + [f"megatron_training.load={save}/iter_0000002",
                                     "megatron_training.no_load_optim=true",
                                     f"megatron_training.save={tmp_path}/ckpt_b"], str(tmp_path / "b"), tiny_model)
    # iteration 3 samples from the same weights: same responses, same rewards
    for key in ("reward/mean", "response_length/mean"):
        assert fresh[0][key] == straight[2][key], key
    # a fresh Adam takes another first step: from the second mini-batch of
    # iteration 3 on, every loss and gradient differs
    for key in ("actor/pg_loss", "actor/grad_norm"):
        assert fresh[0][key] != straight[2][key], key
    # the HF export at the end loads as model_path with the tokenizer's special tokens
    export = os.path.join(save, "hf")
    tok = AutoTokenizer.from_pretrained(export)
    assert (tok.eos_token_id, tok.pad_token_id, len(tok)) == (13, 14, 32)
    assert AutoConfig.from_pretrained(export).vocab_size == 32
    again = run(CONFIG, ["megatron_training.train_iters=1", f"megatron_training.model_path={export}"],
                str(tmp_path / "c"), None)
    assert len(again) == 1


def test_missing_or_corrupt_checkpoint_is_a_clear_error(tiny_model, tmp_path, capsys):
    _, save, overrides = _straight(str(tmp_path), tiny_model, "megatron_training.train_iters=2")
    with open(os.path.join(save, TRACKER), "w") as f:
        f.write("6\n")  # names an iteration that was never saved: the newest complete one is taken, and said
    capsys.readouterr()
    build_configs(load_config(CONFIG, [f"megatron_training.load={save}", "megatron_training.model_path=/x"]))
    assert "iter_0000006" not in capsys.readouterr().out  # said once, by the load itself
    assert find(save)[1] == 2
    said = capsys.readouterr().out
    assert "iter_0000006" in said and "resuming from the previous intact iteration 2" in said
    with pytest.raises(ConfigError, match="does not exist"):
        build_configs(load_config(CONFIG, [f"megatron_training.load={tmp_path}/nothing",
                                           "megatron_training.model_path=/x"]))
    broken = str(tmp_path / "broken" / "iter_0000002")
    shutil.copytree(os.path.join(save, "iter_0000002"), broken)
    shard = sorted(glob.glob(os.path.join(broken, "dcp", "*.distcp")))[0]
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) // 2)
    # found before Ray starts, naming the shard
    with pytest.raises(CheckpointError, match=r"distcp is truncated"):
        run(CONFIG, overrides + [f"megatron_training.load={broken}"], str(tmp_path / "d"), tiny_model)
    for meta in glob.glob(os.path.join(save, "iter_*", "dcp", ".metadata")):
        os.remove(meta)
    with pytest.raises(ConfigError, match=r"iter_0000006.*cannot be loaded.*no older intact iteration"):
        build_configs(load_config(CONFIG, [f"megatron_training.load={save}", "megatron_training.model_path=/x"]))


def test_resume_that_cannot_load_ends_in_one_line_and_touches_no_record(tiny_model, tmp_path, capsys):
    """A changed model shape (3 layers, a matching model folder): the library's missing key in one
    line, and the run folder's records stay as they were (no resume marker, nothing dropped)."""
    save, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    first = ["megatron_training.train_iters=1", f"megatron_training.save={save}"]
    run(CONFIG, first, out, tiny_model)
    with open(os.path.join(out, "metrics.jsonl"), "rb") as f:
        before = f.read()
    capsys.readouterr()
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
    from cli.train_grpo import main
    code = main(["--config", CONFIG, "--output-dir", out, "--tiny-model-dir", str(tmp_path / "model3"),
                 "megatron_training.train_iters=2", f"megatron_training.load={save}",
                 "model.tiny_qwen2.num_layers=3"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert "Missing key in checkpoint state_dict: model.model.layers.2." in err and "'load_checkpoint'" in err
    with open(os.path.join(out, "metrics.jsonl"), "rb") as f:
        assert f.read() == before
