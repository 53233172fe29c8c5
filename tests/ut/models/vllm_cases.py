"""Runs the vLLM backend next to the training engine in a fresh process (vLLM binds the process's threads,
so it must not run inside the pytest process); prints one JSON line of findings.

    python tests/ut/models/vllm_cases.py <work dir>
"""
import json
import os
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")


def main(work: str) -> dict:
    import torch
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from engine_cases import engine_data, linear_loss_fn

    from mindspeed_rl.plan.rollout_spec import RolloutSpec
    from mindspeed_rl.plan.worker_spec import SamplingSpec
    from mindspeed_rl.models.causal_lm import CausalLMEngine
    from mindspeed_rl.models.rollout.vllm_backend import VLLMRollout
    from mindspeed_rl.models.tiny_model import EOS_ID, PAD_ID, build_tiny_checkpoint

    path = build_tiny_checkpoint(os.path.join(work, "tiny"), seed=0, num_attention_heads=2, num_key_value_heads=2)
    cpu = torch.device("cpu")
    actor = CausalLMEngine(path, device=cpu, lr=0.05, pad_id=PAD_ID)
    # a step's token budget of one full sequence (64): rows whose prompts together exceed it prefill over steps
    spec = RolloutSpec("vllm", "test", dtype="float32", max_num_seqs=16, max_model_len=64, max_num_batched_tokens=64,
                       logprobs=0)
    rollout = VLLMRollout(spec, actor, path, cpu, rank=0, world_size=1, seed=0)
    prompts, responses = engine_data(8)
    greedy = SamplingSpec(max_tokens=8, temperature=0.0, top_p=1.0, top_k=-1, min_p=0.0)
    sample = SamplingSpec(max_tokens=8, temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0)

    def hf_greedy():
        return [r.tolist() for r in actor.generate(prompts, max_new_tokens=8, temperature=0.0, eos_id=None)]

    def vllm_tokens(spec_, seeds, eos=None, which=None):
        which = list(range(len(prompts))) if which is None else which
        out = rollout.generate([prompts[i] for i in which], spec_, [seeds[i] for i in which], eos, PAD_ID)
        return [r.tolist() for r in out.responses], out.log_probs

    found = {"start_equal": sum(a == b for a, b in zip(vllm_tokens(greedy, range(8))[0], hf_greedy()))}
    for _ in range(3):  # three optimizer steps move the weights well away from the checkpoint
        actor.train_step(prompts, responses, [list(range(8))], linear_loss_fn([0.0] * 8), token_count=8.0)
    trained = hf_greedy()
    found["stale_equal"] = sum(a == b for a, b in zip(vllm_tokens(greedy, range(8))[0], trained))
    rollout.weights_changed()
    found["synced_equal"] = sum(a == b for a, b in zip(vllm_tokens(greedy, range(8))[0], trained))
    found["prompts"] = len(prompts)
    # sampled tokens: the engine's log-probs against the trainer's for the same tokens
    seeds = [1000 + i for i in range(8)]
    tokens, log_probs = vllm_tokens(sample, seeds, eos=EOS_ID)
    mine, _ = actor.log_probs(prompts, [torch.tensor(t) for t in tokens], [list(range(8))], temperature=1.0)
    found["max_log_prob_diff"] = max(float((a - b).abs().max()) for a, b in zip(log_probs, mine) if a.numel())
    found["log_prob_rows"] = sum(1 for t, lp in zip(tokens, log_probs) if len(t) == lp.numel())
    # a row's response depends on its own seed only, not on what it is batched with
    alone, _ = vllm_tokens(sample, seeds, eos=EOS_ID, which=[5])
    again, _ = vllm_tokens(sample, seeds, eos=EOS_ID)
    other, _ = vllm_tokens(sample, [s + 1 for s in seeds], eos=EOS_ID)
    found["seed_alone_equal"] = alone[0] == tokens[5]
    found["seed_repeat_equal"] = again == tokens
    found["other_seeds_differ"] = other != tokens
    found.update(processed_cases(actor, vllm_tokens, prompts, seeds, EOS_ID))
    found["long_prompts"] = long_prompt_case(rollout, sample)
    return found


def long_prompt_case(rollout, sample) -> dict:
    """Three seeded rows of 40-token prompts: together past the step budget (64), so vLLM would split a row's
    prefill over two steps, which its CPU build cannot do with a seeded row ("CPU Generator does not use
    offset") unless the backend turns chunked prefill off. Last: a failure here leaves the other cases."""
    import torch
    from mindspeed_rl.models.tiny_model import PAD_ID
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(4, 32, (40,), generator=g) for _ in range(3)]
    seeds = [7, 8, 9]
    try:
        together = rollout.generate(prompts, sample, seeds, None, PAD_ID).responses
        alone = [rollout.generate([p], sample, [s], None, PAD_ID).responses[0] for p, s in zip(prompts, seeds)]
    except Exception as err:  # noqa: BLE001  (reported, for the test to name)
        return {"error": f"{type(err).__name__}: {err}"}
    return {"lengths": [len(r) for r in together],
            "alone_equal": [a.tolist() == b.tolist() for a, b in zip(alone, together)]}


def processed_cases(actor, vllm_tokens, prompts, seeds, eos_id) -> dict:
    """The engine's log-probs are those it sampled from: after temperature, min_p and top-k, renormalised.
    Each is compared with the same processing applied here to the trainer's own logits."""
    import torch
    from mindspeed_rl.plan.worker_spec import SamplingSpec

    def logits_of(prompt, response):
        ids = torch.cat([prompt, torch.tensor(response, dtype=prompt.dtype)])
        with torch.no_grad():
            logits = actor.module(ids[None]).logits[0].float()
        return logits[prompt.numel() - 1:prompt.numel() - 1 + len(response)]

    def expected(logits, temperature, top_k, min_p):
        scaled = logits / temperature
        keep = torch.ones_like(scaled, dtype=torch.bool)
        if min_p > 0:
            probs = scaled.softmax(-1)
            keep &= probs >= min_p * probs.max(-1, keepdim=True).values
        if top_k > 0:
            keep &= scaled >= scaled.topk(top_k, -1).values[:, -1:]
        return scaled.masked_fill(~keep, float("-inf")).log_softmax(-1), int((~keep).sum())

    out = {}
    for name, temperature, top_k, min_p in (("t07_k4", 0.7, 4, 0.0), ("t15_minp", 1.5, -1, 0.5)):
        spec = SamplingSpec(max_tokens=8, temperature=temperature, top_p=1.0, top_k=top_k, min_p=min_p)
        tokens, log_probs = vllm_tokens(spec, seeds, eos=eos_id)
        diff, plain_diff, masked, outside = 0.0, 0.0, 0, 0
        for prompt, toks, lps in zip(prompts, tokens, log_probs):
            if not toks:
                continue
            logits = logits_of(prompt, toks)
            processed, dropped = expected(logits, temperature, top_k, min_p)
            index = torch.tensor(toks)[:, None]
            want = processed.gather(1, index)[:, 0]
            outside += int(torch.isinf(want).sum())  # a sampled token the processing would have removed
            diff = max(diff, float((want - lps).abs().max()))
            plain = (logits / temperature).log_softmax(-1).gather(1, index)[:, 0]  # temperature only
            plain_diff = max(plain_diff, float((plain - lps).abs().max()))
            masked += dropped
        out[name] = {"max_diff": diff, "temperature_only_diff": plain_diff, "masked": masked, "outside": outside,
                     "rows": sum(1 for t in tokens if t)}
    return out


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(sys.argv[1])), flush=True)
