"""Upstream's import surface (docs/upstream_api.md): the table is true, and each
helper/adapter gives a real result on a small input."""
import importlib
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "docs" / "upstream_api.md"
STATUSES = ("available", "adapter", "not implemented")


def _rows():
    rows = []
    for line in TABLE.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0].startswith("mindspeed_rl"):
            module, name, _sig, status, also, _here = cells
            rows.append((module, name, status, [p.strip() for p in also.split(",") if p.strip()]))
    return rows


ROWS = _rows()
IMPORTABLE = [r for r in ROWS if r[2] in ("available", "adapter")]
MISSING = [r for r in ROWS if r[2] == "not implemented"]


def _lookup(module: str, name: str):
    return getattr(importlib.import_module(module), name)


def test_table_is_parsed_and_well_formed():
    assert len(ROWS) > 60
    assert all(r[2] in STATUSES for r in ROWS), [r for r in ROWS if r[2] not in STATUSES]
    assert len({(r[0], r[1]) for r in ROWS}) == len(ROWS), "duplicate rows"
    for name in ("TransferDock", "GRPOTransferDock", "RayGRPOTrainer", "get_tokenizer", "seed_all"):
        assert any(r[1] == name and r[2] != "not implemented" for r in ROWS), name


@pytest.mark.parametrize("module,name,status,also", IMPORTABLE, ids=[f"{r[0]}.{r[1]}" for r in IMPORTABLE])
def test_available_rows_import_from_every_listed_path(module, name, status, also):
    obj = _lookup(module, name)
    for package in also:
        assert _lookup(package, name) is obj, f"{package}.{name}"


@pytest.mark.parametrize("module,name,status,also", MISSING, ids=[f"{r[0]}.{r[1]}" for r in MISSING])
def test_not_implemented_rows_do_not_import(module, name, status, also):
    for path in [module, *also]:
        try:
            mod = importlib.import_module(path)
        except ImportError:
            continue
        assert not hasattr(mod, name), f"{path}.{name} exists: mark the row available or adapter"


def test_required_imports():
    from mindspeed_rl import (GenerateConfig, MegatronConfig, Metric, RayActorGroup,
                              RayGRPOTrainer, RLConfig, get_tokenizer, seed_all)
    from mindspeed_rl.workers.scheduler.launcher import RayActorGroup as Launcher
    assert RayActorGroup is Launcher and callable(get_tokenizer) and callable(seed_all)
    from mindspeed_rl.trainer.stage_trainer import StageTableTrainer
    assert RayGRPOTrainer is StageTableTrainer and isinstance(Metric(), Metric)  # upstream's name, one trainer
    assert MegatronConfig().micro_batch_size == 1 and GenerateConfig().infer_tensor_parallel_size >= 1
    from mindspeed_rl.trainer.utils import GRPOTransferDock, TransferDock
    from mindspeed_rl.trainer.utils.transfer_dock import TransferDock as Direct
    assert TransferDock is Direct
    assert hasattr(GRPOTransferDock, "remote")
    assert RLConfig().n_samples_per_prompt >= 1


def test_the_upstream_surface_lives_in_compat_and_imports_from_the_old_paths():
    import mindspeed_rl.compat as compat
    from mindspeed_rl.compat.transfer_dock import PullDock
    from mindspeed_rl.trainer.utils import compute_utils, transfer_dock
    from mindspeed_rl.workers import rule_reward
    from mindspeed_rl.workers.base_worker import BaseWorker
    from mindspeed_rl.workers.scheduler.launcher import RayActorGroup
    assert transfer_dock.GRPOTransferDock is compat.GRPOTransferDock
    assert compat.GRPOTransferDock.__ray_actor_class__ is PullDock  # the actor class serves the pull API
    assert transfer_dock.TransferDock is compat.TransferDock and rule_reward.RuleReward is compat.RuleReward
    for name in ("compute_rule_reward", "compute_advantage", "get_last_reward", "compute_grpo_data_metrics",
                 "dock_call"):
        assert getattr(compute_utils, name) is getattr(compat, name), name
    for name in ("init_transfer_dock", "write_rows", "collect_transfer_dock_data"):
        assert getattr(BaseWorker, name) is getattr(compat.UpstreamWorkerIO, name), name
    assert RayActorGroup.sync_init_transfer_dock is compat.UpstreamGroupIO.sync_init_transfer_dock
    # the driver's dock has none of it: no consumers, waits or locks
    for name in ("get_experience", "all_consumed", "update_metrics", "_wait_for_data", "_data_lock", "timeout"):
        assert not hasattr(transfer_dock.DriverDock(2, 2), name), name


def test_unknown_package_attribute_still_raises_and_submodules_import():
    import mindspeed_rl
    import mindspeed_rl.utils
    with pytest.raises(AttributeError):
        mindspeed_rl.no_such_name  # noqa: B018
    from mindspeed_rl.utils import seqlen_balancing
    assert callable(seqlen_balancing.get_seqlen_balanced_partitions)
    assert "seed_all" in dir(mindspeed_rl)


def test_import_mindspeed_rl_stays_light():
    code = ("import sys, mindspeed_rl; heavy = [m for m in ('torch', 'ray', 'transformers', 'yaml') "
            "if m in sys.modules]; print(','.join(heavy))")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == ""


# ------------------------------------------------------------ helpers, by upstream's path

def test_generate_mask_marks_padding():
    from mindspeed_rl.utils.utils import generate_mask
    batch = torch.tensor([[5, 6, 7, 0], [5, 0, 0, 0], [1, 2, 3, 4]])
    mask = generate_mask(batch, torch.tensor([[3], [1], [4]]))
    assert mask.dtype == torch.int64
    assert mask.tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]


def test_generate_position_ids_per_row():
    from mindspeed_rl.utils.utils import generate_position_ids
    assert generate_position_ids(torch.zeros(2, 3)) == [[0, 1, 2], [0, 1, 2]]


def test_get_tune_attention_mask_is_causal_and_hides_padding():
    from mindspeed_rl.utils.utils import get_tune_attention_mask
    mask1d = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]])
    blocked = get_tune_attention_mask(mask1d)
    assert blocked.shape == (2, 1, 4, 4) and blocked.dtype == torch.bool
    allowed = ~blocked[0, 0]
    assert allowed[2].tolist() == [True, True, True, False]
    assert allowed[3].tolist() == [True, True, True, False]  # key 3 is padding
    assert allowed[1].tolist() == [True, True, False, False]  # causal
    assert (~blocked[1, 0])[3].tolist() == [False, True, True, True]  # left padding hidden
    same = get_tune_attention_mask(mask1d, tokenizer_padding_side="left")
    assert torch.equal(same, blocked)
    with pytest.raises(ValueError):
        get_tune_attention_mask(mask1d, tokenizer_padding_side="middle")


def test_append_to_dict_and_batch_means():
    from mindspeed_rl.utils.utils import append_to_dict, get_batch_metrices_mean
    data = {"a": [1]}
    append_to_dict(data, {"a": 2, "b": 3})
    assert data == {"a": [1, 2], "b": [3]}
    means = get_batch_metrices_mean([{"loss": 1.0, "kl": 0.5}, {}, {"loss": 3.0, "kl": 1.5}])
    assert set(means) == {"loss", "kl"}
    assert float(means["loss"]) == 2.0 and float(means["kl"]) == 1.0


def test_num_floating_point_operations_matches_hand_count():
    from mindspeed_rl.utils.utils import num_floating_point_operations
    args = SimpleNamespace(hidden_size=64, num_attention_heads=4, num_layers=2, seq_length=32,
                           ffn_hidden_size=128, padded_vocab_size=256, kv_channels=None,
                           group_query_attention=True, num_query_groups=2, swiglu=True,
                           num_experts=None, moe_router_topk=2)
    # attention: (1 + 2/4 + 32/64) * 1 = 2; mlp: 2 * 1.5 = 3; logits: 256 / 256 = 1
    expected = 12 * 3 * 32 * 2 * 64 * 64 * (2 + 3 + 1)
    assert num_floating_point_operations(args, 3) == pytest.approx(expected)
    args.num_experts = 8  # MoE: top-2 experts per token
    assert num_floating_point_operations(args, 3) == pytest.approx(12 * 3 * 32 * 2 * 64 * 64 * (2 + 6 + 1))


def test_seed_all_repeats_random_streams(monkeypatch):
    import random

    import numpy as np
    from mindspeed_rl.utils.utils import seed_all
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    before = torch.are_deterministic_algorithms_enabled()
    try:
        seed_all(11)
        first = (random.random(), np.random.rand(), torch.rand(1).item())
        assert torch.are_deterministic_algorithms_enabled()
        seed_all(11, deterministic=False)
        assert (random.random(), np.random.rand(), torch.rand(1).item()) == first
        assert os.environ["PYTHONHASHSEED"] == "11"
        assert not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(before)


def test_synchronize_time_without_process_group():
    import time

    from mindspeed_rl.utils.utils import synchronize_time
    stamp = synchronize_time()
    assert time.mktime(time.strptime(stamp)) == pytest.approx(time.time(), abs=5)


def test_truncate_rows_right_and_left():
    from mindspeed_rl.utils.pad_process import truncate_rows
    t = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    right = truncate_rows(t, torch.tensor([[2], [3]]))
    assert [r.tolist() for r in right] == [[1, 2], [5, 6, 7]]
    left = truncate_rows(t, torch.tensor([[1], [0]]), left_pad=True)
    assert [r.tolist() for r in left] == [[4], []]


def test_remove_padding_and_split_to_list():
    from mindspeed_rl.utils.pad_process import remove_padding_and_split_to_list
    responses = torch.tensor([[7, 8, 2, 0, 0], [9, 2, 0, 0, 0], [4, 5, 6, 7, 8]])
    cut = remove_padding_and_split_to_list(responses, eos_token_id=2, pad_token_id=0)
    assert [r.tolist() for r in cut] == [[7, 8, 2], [9, 2], [4, 5, 6, 7, 8]]
    same = torch.tensor([[7, 8, 2, 2, 2], [4, 5, 6, 7, 8]])  # pad == eos keeps one EOS
    cut = remove_padding_and_split_to_list(same, eos_token_id=2, pad_token_id=2)
    assert [r.tolist() for r in cut] == [[7, 8, 2], [4, 5, 6, 7, 8]]
    as_lists = remove_padding_and_split_to_list(same, eos_token_id=2, pad_token_id=2, to_list=True)
    assert as_lists == [[7, 8], [4, 5, 6, 7]]


def test_truncate_middle_and_pad_moves_window_to_front():
    from mindspeed_rl.utils.pad_process import truncate_middle_and_pad
    x = torch.arange(2 * 5 * 2, dtype=torch.float32).reshape(2, 5, 2)
    out = truncate_middle_and_pad(torch.zeros(2, 3), x, torch.tensor([[1, 4], [3, 9]]), pad_value=-1.0)
    assert out.shape == (2, 3, 2)
    assert torch.equal(out[0], x[0, 1:4])
    assert torch.equal(out[1, :2], x[1, 3:5]) and (out[1, 2] == -1).all()


def test_pad_multiple_rounds_width_up():
    from mindspeed_rl.utils.pad_process import pad_multiple
    out = pad_multiple([torch.tensor([1, 2, 3]), torch.tensor([4])], pad_id=9, multiple=4)
    assert out.tolist() == [[1, 2, 3, 9], [4, 9, 9, 9]]
    assert pad_multiple([torch.tensor([1, 2, 3, 4, 5])], pad_id=0, multiple=4).shape == (1, 8)


def test_get_last_reward_group_normalises():
    from mindspeed_rl.trainer.utils.compute_utils import get_last_reward
    scores = torch.tensor([[1.0], [3.0], [5.0], [5.0]])
    out = get_last_reward(scores, 2)
    assert out.shape == scores.shape
    std = torch.tensor([1.0, 3.0]).std()
    assert out[:2, 0].tolist() == pytest.approx([-1 / std.item(), 1 / std.item()], rel=1e-5)
    assert out[2:, 0].tolist() == [0.0, 0.0]  # equal rewards


def test_loggers_format_and_level(caplog):
    from mindspeed_rl.utils.loggers import Loggers
    log = Loggers("upstream_api_test", logger_level=logging.INFO)
    text = log.handle_msg({"loss": 0.5, "actor/lr": 1e-5}, "INFO", iteration=3, steps=10)
    assert "iteration: 3 / 10" in text and "loss : 0.5000" in text and "actor/lr : 1.0000e-05" in text
    assert log.handle_msg("hello", "WARNING").endswith("WARNING hello")
    log.logger.propagate = True  # let caplog see it
    with caplog.at_level(logging.INFO, logger="upstream_api_test"):
        log.info("shown", iteration=1, steps=2)
        log.debug("hidden")
    assert [r.levelname for r in caplog.records] == ["INFO"]
    assert "iteration: 1 / 2" in caplog.records[0].getMessage()


def _toy_tokenizer_dir(tmp_path):
    from mindspeed_rl.models.tiny_model import build_toy_tokenizer
    tok = build_toy_tokenizer()
    tok.save_pretrained(tmp_path)
    return tok


def test_get_tokenizer_matches_local_tokenizer(tmp_path):
    from mindspeed_rl.utils.tokenizer import get_tokenizer
    local = _toy_tokenizer_dir(tmp_path)
    tok = get_tokenizer(str(tmp_path))
    assert tok.eod == local.eos_token_id and tok.eod_token == local.eos_token
    assert tok.pad == local.pad_token_id
    ids = tok.tokenize("<bos> 1 2")
    assert ids == local.encode("<bos> 1 2")
    assert tok.detokenize(ids) == local.decode(ids)
    assert tok.vocab_size == len(local) and tok.inv_vocab[tok.eod] == local.eos_token
    assert tok.convert_tokens_to_ids("<eos>") == tok.eod  # other attributes reach the HF tokenizer
    with pytest.raises(ValueError, match="already has an EOS"):
        get_tokenizer(str(tmp_path), eos_token="<sep>", eos_token_id=15)
    with pytest.raises(ValueError, match="both"):
        get_tokenizer(str(tmp_path), pad_token_id=3)
    with pytest.raises(ValueError, match="directory"):
        get_tokenizer(str(tmp_path / "missing"))
    with pytest.raises(NotImplementedError):
        get_tokenizer(str(tmp_path), tokenizer_type="SentencePiece")


def test_rule_reward_adapter_scores_like_ours(tmp_path):
    from mindspeed_rl.config_cls import RLConfig
    from mindspeed_rl.rewards.rule_reward import VerifierReward as Ours
    from mindspeed_rl.utils.tokenizer import get_tokenizer
    from mindspeed_rl.workers.rule_reward import RuleReward
    _toy_tokenizer_dir(tmp_path)
    tok = get_tokenizer(str(tmp_path))
    rl = RLConfig({"verifier_function": ["math_acc"], "verifier_weight": [1.0]})
    reward = RuleReward()
    with pytest.raises(RuntimeError):
        reward.compute_rm_score()
    reward.initialize(None, rl, tok)
    responses = [torch.tensor([3, 4, tok.eod]), torch.tensor([3, 5, tok.eod])]
    labels = [torch.tensor([3, 4]), torch.tensor([3, 4])]
    assert reward(responses, labels).tolist() == [1.0, 0.0]
    ours = Ours(["math_acc"], [1.0], tok.eod, tokenizer=tok.tokenizer)
    assert torch.equal(reward(responses, labels), ours(responses, labels))
    ours.close()


def test_rule_reward_adapter_fills_the_dock(tmp_path):
    ray = pytest.importorskip("ray")
    from mindspeed_rl.config_cls import RLConfig
    from mindspeed_rl.trainer.utils import GRPOTransferDock
    from mindspeed_rl.utils.ray_utils import init_ray, shutdown_ray
    from mindspeed_rl.utils.tokenizer import get_tokenizer
    from mindspeed_rl.workers.rule_reward import RuleReward
    started = init_ray(num_cpus=2)
    try:
        td = GRPOTransferDock.remote(2, 2, timeout=30)
        ray.get(td.put_prompts_experience.remote(
            {"prompts": [torch.tensor([1, 2]), torch.tensor([1])], "labels": [torch.tensor([7]), torch.tensor([8])]},
            ["labels"]))
        responses = [torch.tensor([7, 13]), torch.tensor([6, 13]), torch.tensor([8, 13]), torch.tensor([8])]
        ray.get(td.put_experience.remote({"responses": responses}, [0, 1, 2, 3]))
        reward = RuleReward()
        _toy_tokenizer_dir(tmp_path)
        reward.initialize(None, RLConfig({"verifier_function": ["math_acc"], "verifier_weight": [1.0]}),
                          get_tokenizer(str(tmp_path)))
        reward.init_transfer_dock(td)
        metrics = reward.compute_rm_score()
        assert metrics["reward/mean"] == pytest.approx(0.75)
        batch, index = ray.get(td.get_experience.remote("compute_advantage", ["rm_scores"], 4))
        scores = {int(i): float(s) for i, s in zip(index, batch["rm_scores"])}
        assert scores == {0: 1.0, 1: 0.0, 2: 1.0, 3: 1.0}
    finally:
        if started:
            shutdown_ray()


def test_rule_reward_adapter_fills_the_drivers_dock_in_process(tmp_path):
    from mindspeed_rl.config_cls import RLConfig
    from mindspeed_rl.trainer.utils import DriverDock
    from mindspeed_rl.utils.tokenizer import get_tokenizer
    from mindspeed_rl.workers.rule_reward import RuleReward
    dock = DriverDock(2, 2, experience_columns=["prompts", "prompt_length", "responses", "labels", "rm_scores"])
    dock.put_prompts_experience({"prompts": [torch.tensor([1, 2]), torch.tensor([1])],
                                 "labels": [torch.tensor([7]), torch.tensor([8])]}, ["labels"])
    dock.put_experience({"responses": [torch.tensor([7, 13]), torch.tensor([6, 13]), torch.tensor([8, 13]),
                                       torch.tensor([8])]}, [0, 1, 2, 3])
    reward = RuleReward()
    _toy_tokenizer_dir(tmp_path)
    reward.initialize(None, RLConfig({"verifier_function": ["math_acc"], "verifier_weight": [1.0]}),
                      get_tokenizer(str(tmp_path)))
    reward.init_transfer_dock(dock)
    assert reward.compute_rm_score()["reward/mean"] == pytest.approx(0.75)
    assert [float(s) for s in dock.get_rows(["rm_scores"], [0, 1, 2, 3])["rm_scores"]] == [1.0, 0.0, 1.0, 1.0]


def test_an_upstream_style_rank_pulls_its_rows_and_writes_back_through_the_dock_actor(monkeypatch):
    """Upstream's worker loop over a GRPOTransferDock actor: get_experience, compute,
    collect_transfer_dock_data; only the TP source writes."""
    import ray

    from mindspeed_rl.compat.transfer_dock import PullDock
    from mindspeed_rl.workers.base_worker import BaseWorker

    class Handle:  # an actor handle, served in-process
        def __init__(self, obj):
            self.obj = obj

        def __getattr__(self, name):
            return type("Remote", (), {"remote": staticmethod(getattr(self.obj, name))})

    monkeypatch.setattr(ray, "get", lambda value, **_: value)
    dock = PullDock(2, 2, timeout=5)
    dock.put_prompts_experience({"prompts": [torch.tensor([1, 2]), torch.tensor([3])]})
    ranks = []
    for tp_rank in (0, 1):
        rank = BaseWorker.__new__(BaseWorker)  # no process group: only the dock path
        rank.parallel_state = SimpleNamespace(tp_rank=tp_rank)
        rank.init_transfer_dock(Handle(dock))
        ranks.append(rank)
    batch, index = ray.get(ranks[0].td.get_experience.remote("actor_log_prob", ["prompts"], 4))
    output = {"old_log_prob": [torch.full((p.numel(),), float(i)) for p, i in zip(batch["prompts"], index)]}
    ranks[1].collect_transfer_dock_data({"old_log_prob": [torch.zeros(1)] * 4}, index)  # a TP peer: no write
    assert not bool(dock.experience_data_status["old_log_prob"].any())
    ranks[0].collect_transfer_dock_data(output, index)
    got = dock.get_rows(["old_log_prob"], [0, 1, 2, 3])["old_log_prob"]
    assert [t.tolist() for t in got] == [[0.0, 0.0], [1.0, 1.0], [2.0], [3.0]]
    ranks[0].shutdown()
    assert ranks[0].td is None
