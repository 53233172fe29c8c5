"""The engine's defaults and precision settings as behaviour: the default optimizer step against a hand
AdamW step, clipping at 1.0 by default, the seed, autocast's dtype, and the metrics prefix."""
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from mindspeed_rl.models.causal_lm import CausalLMEngine

PROMPT, RESPONSE = torch.tensor([5, 6, 7]), torch.tensor([8, 9, 10])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    cfg = Qwen2Config(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, intermediate_size=32, tie_word_embeddings=True,
                      max_position_embeddings=64)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny_qwen2_defaults")
    Qwen2ForCausalLM(cfg).save_pretrained(str(path))
    return str(path)


def _loss(scale):
    # scale * the response's log-prob sum: a large scale gives a gradient norm far above 1
    def loss_fn(indexes, log_probs, entropies):
        return scale * sum(lp.sum() for lp in log_probs), {}
    return loss_fn


def _hand_step(model_dir, scale, clip, **adamw):
    """One AdamW step of a plain model on the same loss, clipped to ``clip`` (None: not clipped)."""
    model = Qwen2ForCausalLM.from_pretrained(model_dir)
    ids = torch.cat([PROMPT, RESPONSE])[None]
    logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    rows = logp[PROMPT.numel() - 1:-1].gather(-1, RESPONSE[:, None])
    (scale * rows.sum() / RESPONSE.numel()).backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    torch.optim.AdamW(model.parameters(), **adamw).step()
    return dict(model.named_parameters())


def _engine_step(engine, scale):
    metrics = engine.train_step([PROMPT], [RESPONSE], [[0]], _loss(scale), RESPONSE.numel())
    return metrics, dict(engine.module.named_parameters())


def _assert_same(got, want):
    for name, w in want.items():
        torch.testing.assert_close(got[name], w, atol=2e-6, rtol=1e-5, msg=name)


def test_default_step_is_adamw_lr_1e3_no_weight_decay_eps_1e8(model_dir):
    engine = CausalLMEngine(model_dir, torch.device("cpu"))
    _, got = _engine_step(engine, 1.0)
    want = _hand_step(model_dir, 1.0, 1.0, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    _assert_same(got, want)


def test_gradients_are_clipped_to_norm_one_by_default(model_dir):
    # a large Adam eps makes the step proportional to the gradient, so clipping shows in the weights
    engine = CausalLMEngine(model_dir, torch.device("cpu"), eps=10.0)
    metrics, got = _engine_step(engine, 50.0)
    assert metrics["actor/grad_norm"] > 3.0  # reported before clipping
    _assert_same(got, _hand_step(model_dir, 50.0, 1.0, lr=1e-3, eps=10.0, weight_decay=0.0))
    unclipped = _hand_step(model_dir, 50.0, None, lr=1e-3, eps=10.0, weight_decay=0.0)
    assert any(not torch.allclose(got[n], w, atol=2e-6) for n, w in unclipped.items())


def test_building_an_engine_seeds_the_process_rng(model_dir):
    CausalLMEngine(model_dir, torch.device("cpu"), trainable=False)
    assert torch.initial_seed() == 1234
    CausalLMEngine(model_dir, torch.device("cpu"), trainable=False, seed=7)
    assert torch.initial_seed() == 7


def _plain_log_probs(model, dtype=None):
    ids = torch.cat([PROMPT, RESPONSE])[None]
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        logits = model(input_ids=ids).logits[0].float()
    return torch.log_softmax(logits, dim=-1)[PROMPT.numel() - 1:-1].gather(-1, RESPONSE[:, None]).squeeze(-1)


@pytest.mark.parametrize("autocast", [torch.float16, torch.bfloat16])
def test_autocast_runs_the_forwards_in_the_dtype_given(model_dir, autocast):
    engine = CausalLMEngine(model_dir, torch.device("cpu"), trainable=False, autocast_dtype=autocast)
    got = engine.log_probs([PROMPT], [RESPONSE], [[0]])[0][0]
    torch.testing.assert_close(got, _plain_log_probs(engine.module, autocast), atol=1e-6, rtol=0)
    full = _plain_log_probs(engine.module)
    assert not torch.equal(got, full)  # lower precision shows in the values
    torch.testing.assert_close(got, full, atol=0.05, rtol=0)


def test_an_autocast_dtype_equal_to_the_weights_is_no_autocast(model_dir):
    engine = CausalLMEngine(model_dir, torch.device("cpu"), trainable=False, autocast_dtype=torch.float32)
    got = engine.log_probs([PROMPT], [RESPONSE], [[0]])[0][0]
    assert torch.equal(got, _plain_log_probs(engine.module))


def test_metrics_prefix_names_the_train_step_metrics(model_dir):
    engine = CausalLMEngine(model_dir, torch.device("cpu"), metrics_prefix="policy")
    metrics, _ = _engine_step(engine, 1.0)
    assert set(metrics) == {"policy/lr", "policy/grad_norm", "policy/skipped_steps"}
