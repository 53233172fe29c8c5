"""Settings of response generation (``generate_config`` section)."""
from collections.abc import Mapping

from mindspeed_rl.config_cls.base_config import BaseConfig, merge_sub_dict

# Sampling defaults; a partial ``sampling_config`` is merged over these.
SAMPLING_DEFAULTS = {
    "logprobs": 1,        # how many top log-probs to return per token
    "max_tokens": 128,    # longest response in tokens
    "top_p": 1.0,         # nucleus sampling mass
    "top_k": 50,          # keep this many best tokens (-1: no limit)
    "min_p": 0.0,         # drop tokens below this probability
    "temperature": 0.2,   # logits are divided by this
    "detokenize": False,  # also return decoded text
    "seed": None,         # sampling seed (None: not fixed)
}


class GenerateConfig(BaseConfig):
    """Generation settings. Keys and defaults:

    rollout_backend ('auto'): 'vllm' (an in-process vLLM engine per actor rank), 'hf' (transformers
        generate on the actor), or 'auto': vLLM when installed and able to run the model, else hf
        (plan/rollout_spec.py).
    data_parallel_size (None): rollout DP size; filled by validation.
    tokenizer_name_or_path ('/path/to/tokenizer'): tokenizer used by rollout.
    trust_remote_code (True): allow custom code when loading HF objects.
    infer_tensor_parallel_size (8), infer_pipeline_parallel_size (1),
    infer_expert_parallel_size (1): parallel layout of the inference engine.
    max_num_seqs (1): sequences decoded together.
    max_model_len (2048): longest prompt + response the engine accepts.
    max_num_batched_tokens (2048): token budget of one engine step.
    dtype ('bfloat16'): weight dtype of the inference engine.
    gpu_memory_utilization (0.5): device memory share for the engine.
    offload_train_optimizer / offload_train_grad / offload_train_param (False):
        move training state off the device while generating.
    enable_prefix_caching (False): reuse KV cache of shared prefixes.
    num_scheduler_steps (1): decode steps per scheduler call.
    enforce_eager (False): never capture graphs.
    torchair_graph (False), enable_expert_parallel (False), expert_map_path (None),
    ascend_scheduler_config_enabled (True): vLLM-Ascend settings (see unimplemented.py).
    sampling_config: see SAMPLING_DEFAULTS; unknown sub-keys are rejected.
    """

    def __init__(self, config_dict=None):
        self.rollout_backend = "auto"
        self.data_parallel_size = None
        self.tokenizer_name_or_path = "/path/to/tokenizer"
        self.trust_remote_code = True
        self.infer_tensor_parallel_size = 8
        self.infer_pipeline_parallel_size = 1
        self.infer_expert_parallel_size = 1
        self.max_num_seqs = 1
        self.max_model_len = 2048
        self.max_num_batched_tokens = 2048
        self.dtype = "bfloat16"
        self.gpu_memory_utilization = 0.5
        self.offload_train_optimizer = False
        self.offload_train_grad = False
        self.offload_train_param = False
        self.enable_prefix_caching = False
        self.num_scheduler_steps = 1
        self.enforce_eager = False
        self.torchair_graph = False
        self.enable_expert_parallel = False
        self.expert_map_path = None
        self.ascend_scheduler_config_enabled = True
        self.sampling_config = dict(SAMPLING_DEFAULTS)
        self.update(config_dict)

    def update(self, config_dict, model_config_dict=None):
        if not isinstance(config_dict, Mapping):
            super().update(config_dict, model_config_dict)  # None is a no-op, else TypeError
            return
        config_dict = {str(k).replace("-", "_"): v for k, v in config_dict.items()}
        sampling = config_dict.pop("sampling_config", None)
        super().update(config_dict, model_config_dict)
        if sampling is not None:
            self.sampling_config = merge_sub_dict(
                "GenerateConfig", "sampling_config", self.sampling_config,
                sampling, SAMPLING_DEFAULTS)
