"""The engine with a value head (PPO's critic): alignment of values, training, checkpoints, families, sharding."""
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import CohereConfig, Qwen2Config, Qwen2ForCausalLM

from mindspeed_rl.models import sharding
from mindspeed_rl.models.causal_lm import CausalLMEngine
from mindspeed_rl.models.loss.value_loss import value_loss
from mindspeed_rl.families import families
from mindspeed_rl.models.tiny_model import build_tiny_checkpoint
from ut.models.engine_cases import engine_data

# a single-process DCP save / load says it runs without torch.distributed
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

N = 8
ALL = list(range(N))
SPLIT = [[0, 1, 2], [3, 4, 5, 6, 7]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    cfg = Qwen2Config(vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=True,
                      max_position_embeddings=64)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny_qwen2_value")
    Qwen2ForCausalLM(cfg).save_pretrained(str(path))
    return str(path)


def _engine(path, mesh=None, fsdp=False, seed=0, trainable=True, remove_padding=True):
    return CausalLMEngine(path, torch.device("cpu"), use_remove_padding=remove_padding, lr=1e-2, eps=1e-2,
                          seed=seed, mesh=mesh, fsdp=fsdp, trainable=trainable, head="value")


def _targets(responses):
    """Fixed returns to regress on, one per response token."""
    g = torch.Generator().manual_seed(11)
    return [torch.randn(r.numel(), generator=g) for r in responses]


def _loss_fn(mine, old_values, returns, clip=0.5):
    # mine: local sample index -> global one
    def loss_fn(idx, vpreds, entropies):
        assert entropies is None
        g = [mine[i] for i in idx]
        return value_loss(vpreds, [old_values[j] for j in g], [returns[j] for j in g], None, clip)
    return loss_fn


def _mean_loss(values, returns):
    return float(sum(((v - r) ** 2).sum() for v, r in zip(values, returns)) / sum(r.numel() for r in returns))


def _manual_values(module, prompt, response):
    ids = torch.cat([prompt, response])[None]
    with torch.no_grad():
        out = module(input_ids=ids).logits[0, :, 0].float()
    p = prompt.numel()
    return out[p - 1:p - 1 + response.numel()]


def test_value_model_is_a_one_output_token_classifier(model_dir):
    engine = _engine(model_dir, trainable=False)
    module = engine.module
    assert type(module).__name__ == "Qwen2ForTokenClassification"
    assert module.score.out_features == 1 and not hasattr(module, "lm_head")
    assert module.dropout.p == 0.0  # training forwards stay deterministic
    assert engine.metrics_prefix == "critic"
    plan = sharding.tp_plan(module)
    assert plan and not any("score" in name for name in plan)  # the head stays whole over tp
    # the base model's weights come from the checkpoint
    lm = Qwen2ForCausalLM.from_pretrained(model_dir)
    torch.testing.assert_close(module.model.embed_tokens.weight, lm.model.embed_tokens.weight)


@pytest.mark.parametrize("remove_padding", [False, True])
def test_values_align_with_a_manual_forward(model_dir, remove_padding):
    prompts, responses = engine_data(N)
    responses[5] = responses[5][:0]  # an empty response
    engine = _engine(model_dir, trainable=False, remove_padding=remove_padding)
    values = engine.values(prompts, responses, [[6, 0, 2], [5, 3, 1, 4]])  # 7 is in no micro-batch
    assert values[7] is None
    for i in range(7):
        assert values[i].dtype == torch.float32 and values[i].shape == responses[i].shape
        torch.testing.assert_close(values[i], _manual_values(engine.module, prompts[i], responses[i]),
                                   atol=1e-5, rtol=1e-5)
    # the first response token's value is read at the prompt's last token
    with torch.no_grad():
        prompt_only = engine.module(input_ids=prompts[0][None]).logits[0, -1, 0]
    torch.testing.assert_close(values[0][0], prompt_only, atol=1e-5, rtol=1e-5)


def test_value_engine_refuses_lm_calls(model_dir):
    prompts, responses = engine_data(2)
    engine = _engine(model_dir, trainable=False)
    with pytest.raises(RuntimeError, match="head='lm'"):
        engine.log_probs(prompts, responses, [[0, 1]])
    with pytest.raises(RuntimeError, match="head='lm'"):
        engine.generate(prompts, max_new_tokens=2)
    lm = CausalLMEngine(model_dir, torch.device("cpu"), trainable=False)
    with pytest.raises(RuntimeError, match="head='value'"):
        lm.values(prompts, responses, [[0, 1]])
    with pytest.raises(ValueError, match="head"):
        CausalLMEngine(model_dir, torch.device("cpu"), head="policy")


def test_training_on_fixed_returns_lowers_the_value_loss(model_dir):
    prompts, responses = engine_data(N)
    returns = _targets(responses)
    tokens = sum(r.numel() for r in responses)
    engine = _engine(model_dir)
    before = engine.values(prompts, responses, SPLIT)
    losses = [_mean_loss(before, returns)]
    for _ in range(6):
        old = engine.values(prompts, responses, SPLIT)
        metrics = engine.train_step(prompts, responses, SPLIT, _loss_fn(ALL, old, returns), tokens)
        losses.append(_mean_loss(engine.values(prompts, responses, SPLIT), returns))
    assert {"critic/grad_norm", "critic/lr", "critic/skipped_steps", "critic/vf_loss",
            "critic/vf_clipfrac", "critic/vpred_mean"} <= set(metrics)
    assert not any(k.startswith("actor/") for k in metrics)
    assert metrics["critic/lr"] == pytest.approx(1e-2) and metrics["critic/skipped_steps"] == 0.0
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize("remove_padding", [False, True])
def test_gradient_invariant_to_micro_batch_split(model_dir, remove_padding):
    prompts, responses = engine_data(N)
    returns = _targets(responses)
    tokens = sum(r.numel() for r in responses)
    engine = _engine(model_dir, remove_padding=remove_padding)
    old = engine.values(prompts, responses, [ALL])
    old = [v + 0.3 for v in old]  # some predictions outside the clip range

    def grads(micro_batches):
        engine.compute_grads(prompts, responses, micro_batches, _loss_fn(ALL, old, returns, clip=0.2), tokens)
        return {n: p.grad.clone() for n, p in engine.module.named_parameters()}

    whole, split = grads([ALL]), grads([[4], [0, 7, 2], [1, 3, 5, 6], []])
    assert whole["score.weight"].abs().sum() > 0
    for name in whole:
        torch.testing.assert_close(split[name], whole[name], atol=1e-6, rtol=1e-5, msg=name)


def test_dcp_and_pretrained_round_trips(model_dir, tmp_path):
    prompts, responses = engine_data(N)
    returns = _targets(responses)
    tokens = sum(r.numel() for r in responses)
    engine = _engine(model_dir)
    old = engine.values(prompts, responses, SPLIT)
    engine.train_step(prompts, responses, SPLIT, _loss_fn(ALL, old, returns), tokens)
    trained = engine.values(prompts, responses, SPLIT)
    engine.save_sharded(str(tmp_path / "dcp"))
    engine.save(str(tmp_path / "hf"))

    # another seed draws another score head: the load must replace it, and the optimizer state too
    other = _engine(model_dir, seed=5)
    assert not torch.allclose(other.values(prompts, responses, SPLIT)[0], trained[0])
    other.load_sharded(str(tmp_path / "dcp"))
    for a, b in zip(other.values(prompts, responses, SPLIT), trained):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    for e in (engine, other):
        e.train_step(prompts, responses, SPLIT, _loss_fn(ALL, trained, returns), tokens)
    for a, b in zip(other.values(prompts, responses, SPLIT), engine.values(prompts, responses, SPLIT)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)

    # save_pretrained writes a one-label token-classification model that loads back as it was
    reloaded = _engine(str(tmp_path / "hf"), seed=5, trainable=False)
    assert reloaded.module.config.architectures == ["Qwen2ForTokenClassification"]
    for a, b in zip(reloaded.values(prompts, responses, SPLIT), trained):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("family", sorted(families()))
def test_every_family_has_a_value_head(tmp_path, family):
    path = build_tiny_checkpoint(tmp_path / family, model_type=family)
    prompts, responses = engine_data(3)
    engine = _engine(path)
    assert type(engine.module).__name__.endswith("ForTokenClassification")
    values = engine.values(prompts, responses, [[0, 1, 2]])
    for p, r, v in zip(prompts, responses, values):
        torch.testing.assert_close(v, _manual_values(engine.module, p, r), atol=1e-5, rtol=1e-5)
    tokens = sum(r.numel() for r in responses)
    metrics = engine.train_step(prompts, responses, [[0, 1], [2]], _loss_fn([0, 1, 2], values, _targets(responses)),
                                tokens)
    assert metrics["critic/grad_norm"] > 0 and metrics["critic/skipped_steps"] == 0.0


def test_family_without_a_token_classifier_is_refused(tmp_path):
    # transformers has no CohereForTokenClassification; the config alone is enough to refuse
    CohereConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                 intermediate_size=32).save_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match="'cohere'"):
        _engine(str(tmp_path), trainable=False)


# ------------------------------------------------------------------ sharded (gloo, CPU)

def _worker(rank, world, dp, tp, init_file, model_dir, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        prompts, responses = engine_data(N)
        returns = _targets(responses)
        tokens = sum(r.numel() for r in responses)
        engine = _engine(model_dir, mesh=sharding.build_mesh("cpu", dp, tp), fsdp=True)
        before = engine.values(prompts, responses, SPLIT)
        mine = list(range(rank // tp, N, dp))  # this DP rank's samples
        local_mb = [list(range(0, 2)), list(range(2, len(mine)))]
        metrics = engine.train_step([prompts[i] for i in mine], [responses[i] for i in mine], local_mb,
                                    _loss_fn(mine, before, returns), tokens, dp_size=dp)
        after = engine.values(prompts, responses, SPLIT)
        engine.save_sharded(os.path.join(out_dir, "dcp"))
        engine.save(os.path.join(out_dir, "hf"))
        score_mesh = engine.module.score.weight.device_mesh.mesh_dim_names
        torch.save({"before": before, "after": after, "grad_norm": metrics["critic/grad_norm"],
                    "score_mesh": score_mesh},
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("dp,tp", [(2, 1), (2, 2)])
def test_fsdp_ranks_match_single_process(model_dir, tmp_path, dp, tp):
    prompts, responses = engine_data(N)
    returns = _targets(responses)
    tokens = sum(r.numel() for r in responses)
    single = _engine(model_dir)
    before = single.values(prompts, responses, [ALL])
    metrics = single.train_step(prompts, responses, [ALL], _loss_fn(ALL, before, returns), tokens)
    after = single.values(prompts, responses, [ALL])

    world = dp * tp
    mp.spawn(_worker, args=(world, dp, tp, str(tmp_path / "init"), model_dir, str(tmp_path)), nprocs=world, join=True)
    for rank in range(world):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        for a, b in zip(got["before"], before):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        for a, b in zip(got["after"], after):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        assert got["grad_norm"] == pytest.approx(metrics["critic/grad_norm"], rel=1e-5)
        assert got["score_mesh"] == ("dp",)  # FSDP shards the head over dp; tp leaves it whole
    # the sharded checkpoint loads into one process; the gathered HF export loads as a value model
    resumed = _engine(model_dir, seed=5)
    resumed.load_sharded(str(tmp_path / "dcp"))
    exported = _engine(str(tmp_path / "hf"), seed=5, trainable=False)
    for engine in (resumed, exported):
        for a, b in zip(engine.values(prompts, responses, SPLIT), after):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
