"""Shrinking upstream's shipped configs to a tiny model by overrides only (shared by system tests)."""
import os

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
UPSTREAM_CONFIGS = os.path.join(ROOT, "tests", "data", "upstream_configs")


def tiny_shape(model_section: str) -> list:
    """Overrides that give ``model.<name>`` a tiny shape; every other model key stays the file's."""
    m = f"model.{model_section}"
    return [f"{m}.num_layers=2", f"{m}.hidden_size=64", f"{m}.ffn_hidden_size=128",
            f"{m}.num_attention_heads=4", f"{m}.num_query_groups=2", f"{m}.kv_channels=16",
            f"{m}.padded_vocab_size=32", f"{m}.max_position_embeddings=64"]
