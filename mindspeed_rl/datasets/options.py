"""The data options of a run, from its configs, for ``prompt_batches(..., **options)``."""
from typing import Any, Dict


def data_options(actor_config, rl_config) -> Dict[str, Any]:
    """Keyword options for ``prompt_batches`` from ``megatron_training``/``actor_config`` and ``rl_config``.

    map_keys, prompt_type, system_prompt and split come from the actor's
    megatron keys, shuffle is ``not no_shuffle``, and max_prompt_length is
    ``rl_config.max_prompt_length``. Toy data ignores them; a plain
    ``{"prompt", "label"}`` JSONL file without map_keys and prompt_type is
    read as before (file order, no template, no length filter).
    """
    map_keys = actor_config.map_keys
    if map_keys is not None and not isinstance(map_keys, dict):
        map_keys = dict(map_keys)  # an OmegaConf or other mapping
    return {
        "map_keys": map_keys,
        "prompt_type": actor_config.prompt_type,
        "system_prompt": actor_config.system_prompt,
        "split": actor_config.split,
        "shuffle": not actor_config.no_shuffle,
        "max_prompt_length": rl_config.max_prompt_length,
    }
