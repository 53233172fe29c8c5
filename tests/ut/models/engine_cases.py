"""Shared inputs of the engine equivalence tests: a fixed batch and a loss linear in the log-probs."""
import torch


def engine_data(n: int):
    """``n`` short random prompts and responses (token ids 4..31), the same on every call."""
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(4, 32, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g) for _ in range(n)]
    responses = [torch.randint(4, 32, (int(torch.randint(1, 7, (1,), generator=g)),), generator=g) for _ in range(n)]
    return prompts, responses


def linear_loss_fn(mine):
    """Loss with a per-row weight from ``mine``: the engine's gradient is then easy to compare across layouts."""
    def loss_fn(indexes, log_probs, entropies):
        total = torch.zeros(())
        for i, lp in zip(indexes, log_probs):
            total = total + (-(0.6 - 0.15 * mine[i]) * lp).sum()
        return total, {"actor/loss_sum": float(total.detach())}
    return loss_fn


def small_qwen2_dir(tmp_path_factory, name: str, kv_heads: int = 1) -> str:
    """A one-layer, 16-wide tied Qwen2 saved under a fresh temp folder (for tests that build many engines)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=kv_heads, intermediate_size=32, tie_word_embeddings=True,
                      max_position_embeddings=64)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp(name)
    Qwen2ForCausalLM(cfg).save_pretrained(str(path))
    return str(path)
