"""Upstream's Qwen3-8B GRPO config, as shipped, shrunk to a tiny model by overrides only, trains 2 iterations
through cli/train_grpo.py (DP=2 on CPU; its PP=2 layout is served by the sharded engine)."""
import json
import os
import sys

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, ROOT)
from cli.train_grpo import run  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from upstream_shrink import UPSTREAM_CONFIGS, tiny_shape  # noqa: E402

CONFIG = os.path.join(UPSTREAM_CONFIGS, "05a90d7", "configs", "grpo_qwen3_8b_A3.yaml")
# tiny shapes; every other key (qk_layernorm, untied embeddings, rotary_base, init_method_std, ...) is the file's
TINY = tiny_shape("qwen3_8b")


def test_qwen3_8b_config_shrunk_by_overrides_trains_two_iterations(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the file's relative paths (load: ./qwen3-8b-tp2-pp2/) resolve in here
    model_dir = tmp_path / "model"
    overrides = TINY + [
        f"megatron_training.tokenizer_name_or_path={model_dir}",  # the toy tokenizer built next to the model
        "megatron_training.data_path=toy:length", "megatron_training.global_batch_size=4",
        "megatron_training.seq_length=32", "megatron_training.train_iters=2",
        "actor_config.tensor_model_parallel_size=1", f"actor_config.save={tmp_path / 'ckpt'}",
        "rl_config.actor_resource.num_npus=2", "rl_config.n_samples_per_prompt=4", "rl_config.max_prompt_length=8",
        "rl_config.verifier_function=[length_match]",
        "generate_config.max_model_len=64", "generate_config.sampling_config.max_tokens=10",
    ]
    history = run(CONFIG, overrides, str(tmp_path / "out"), str(model_dir))
    out, err = capsys.readouterr()
    assert "run plan: layout DP=2 TP=1 (2 workers, fsdp engine); 16 rows per round" in out
    # the file's PP=2 on 2 devices runs as DP=2 with the sharded engine, said in one line
    layout = [line for line in err.splitlines() if line.startswith("layout:")]
    assert len(layout) == 1 and "asks for TP=1 x PP=2 x DP=1 on 2 devices; runs DP=2 x TP=1" in layout[0]
    with open(model_dir / "config.json", encoding="utf-8") as f:
        hf = json.load(f)
    assert hf["architectures"] == ["Qwen3ForCausalLM"]  # qk_layernorm in upstream's model section
    assert (hf["num_hidden_layers"], hf["hidden_size"], hf["vocab_size"]) == (2, 64, 32)
    assert hf["tie_word_embeddings"] is False and hf["initializer_range"] == 0.01  # the file's own values
    assert len(history) == 2
    for m in history:
        assert np.isfinite(m["actor/pg_loss"]) and np.isfinite(m["actor/grad_norm"]) and m["actor/grad_norm"] > 0
        assert m["actor/skipped_steps"] == 0
        assert {"timing/actor_train/rank0", "timing/actor_train/rank1"} <= set(m)
    # the file's save: (overridden to tmp) gets the checkpoint and the HF export at the end
    assert os.path.isfile(tmp_path / "ckpt" / "hf" / "config.json")
