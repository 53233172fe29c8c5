"""transformers generate as a rollout backend for partial rollout: per-row budgets, and each sampled token's
log-prob under the distribution it was drawn from (checked against the trainer's own forward pass)."""
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from mindspeed_rl.models.causal_lm import CausalLMEngine
from mindspeed_rl.models.rollout.hf_backend import HFRollout
from mindspeed_rl.plan.worker_spec import SamplingSpec

EOS, PAD = 3, 0
PROMPTS = [torch.tensor([5, 6, 7]), torch.tensor([8]), torch.tensor([9, 10, 11, 12, 13])]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf_lp") / "m"
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                      eos_token_id=EOS, pad_token_id=PAD)
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    return CausalLMEngine(str(path), torch.device("cpu"), trainable=False, pad_id=PAD)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_log_probs_equal_the_trainers_at_that_temperature(engine, temperature):
    responses, log_probs = engine.generate(PROMPTS, max_new_tokens=6, temperature=temperature, eos_id=EOS,
                                           seed=11, with_log_probs=True)
    plain = engine.generate(PROMPTS, max_new_tokens=6, temperature=temperature, eos_id=EOS, seed=11)
    assert all(torch.equal(a, b) for a, b in zip(responses, plain))  # asking for log-probs changes no sample
    trainer, _ = engine.log_probs(PROMPTS, responses, [[0, 1, 2]], temperature=temperature)
    for lp, ref, resp in zip(log_probs, trainer, responses):
        assert lp.dtype == torch.float32 and lp.numel() == resp.numel()
        torch.testing.assert_close(lp, ref, atol=1e-5, rtol=1e-5)


def test_top_k_log_probs_are_renormalised_over_the_kept_tokens(engine):
    responses, log_probs = engine.generate(PROMPTS, max_new_tokens=5, temperature=1.0, top_k=2, eos_id=None,
                                           seed=5, with_log_probs=True)
    for prompt, response, lp in zip(PROMPTS, responses, log_probs):
        ids = torch.cat([prompt, response]).long()
        with torch.no_grad():
            logits = engine.module(input_ids=ids[None]).logits[0, prompt.numel() - 1:-1].float()
        top = logits.topk(2, dim=-1)
        want = []
        for t, token in enumerate(response.tolist()):
            kept = top.indices[t].tolist()
            assert token in kept  # a top-2 draw
            want.append(torch.log_softmax(top.values[t], dim=-1)[kept.index(token)])
        torch.testing.assert_close(lp, torch.stack(want), atol=1e-5, rtol=1e-5)


def test_budgets_cut_each_row_and_its_log_probs(engine):
    sampling = SamplingSpec(max_tokens=8, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0)
    backend = HFRollout(engine, log_probs=True)
    whole = backend.generate(PROMPTS, sampling, [4, 4, 4], eos_id=None, pad_id=PAD)
    cut = backend.generate(PROMPTS, sampling, [4, 4, 4], eos_id=None, pad_id=PAD, budgets=[2, 5, 1])
    assert [r.numel() for r in whole.responses] == [8, 8, 8]
    assert [r.numel() for r in cut.responses] == [2, 5, 1]
    assert [lp.numel() for lp in cut.log_probs] == [2, 5, 1]
    # one batch at the largest budget: each row is the start of what it samples under the same seed
    five = backend.generate(PROMPTS, sampling, [4, 4, 4], eos_id=None, pad_id=PAD, budgets=[5, 5, 5])
    for r, f in zip(cut.responses, five.responses):
        assert torch.equal(r, f[:r.numel()])
    assert HFRollout(engine).generate(PROMPTS, sampling, [4, 4, 4], None, PAD).log_probs is None
