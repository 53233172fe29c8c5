"""Rollout through an in-process vLLM engine colocated with the rank's training engine (hybrid engine).

The engine loads the actor's checkpoint once; after the actor's weights change (an update, a checkpoint
load) the next ``generate`` first streams them into the engine one parameter at a time (gathered from the
FSDP / TP shards, cast to the rollout dtype), so every rollout samples from the policy being trained.
Each prompt gets its own sampling seed, so a row's response does not depend on what it is batched with.
"""
import math
import os
from typing import Iterator, List, Tuple

import torch
from torch.distributed.tensor import DTensor

from mindspeed_rl.models.rollout.base import RolloutBackend, RolloutResult
from mindspeed_rl.utils.token_ids import token_ids

_MIB = 2 ** 20


def cpu_bind(rank: int, ranks_on_node: int, cores: List[int]) -> str:
    """This rank's share of the node's cores for vLLM's OpenMP threads ('0', '2-3', ...): an equal slice
    per rank; ranks share cores round-robin when there are more ranks than cores."""
    cores = sorted(cores)
    per = max(1, len(cores) // max(1, ranks_on_node))
    start = (rank * per) % len(cores)
    mine = cores[start:start + per]
    return ",".join(str(c) for c in mine)


def kv_cache_bytes(hf_config, spec, dtype: torch.dtype, ranks_on_node: int, total_memory: int) -> int:
    """CPU KV cache: room for ``max_num_seqs`` sequences of ``max_model_len`` tokens, at most
    ``gpu_memory_utilization`` of this rank's share of host memory."""
    text = getattr(hf_config, "text_config", hf_config)
    layers = text.num_hidden_layers
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    per_token = 2 * layers * kv_heads * head_dim * torch.finfo(dtype).bits // 8
    need = per_token * spec.max_num_seqs * spec.max_model_len
    cap = int(spec.gpu_memory_utilization * total_memory / max(1, ranks_on_node))
    return max(16 * _MIB, min(math.ceil(need * 1.25), cap))


class VLLMRollout(RolloutBackend):
    name = "vllm"

    def __init__(self, spec, actor, model_path: str, device, rank: int, world_size: int, seed: int,
                 trust_remote_code: bool = False):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine lives in this process
        # vLLM's start-up chatter (and its tokenizer-less chat warm-up warning) off unless asked for
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        self.settings, self.actor, self.device = spec, actor, device
        # spec.dtype is a torch dtype name (rollout_spec.DTYPES), or 'auto': the actor's own
        self.dtype = (next(actor.module.parameters()).dtype if spec.dtype == "auto"
                      else getattr(torch, spec.dtype))
        self.stale = False  # the engine starts from model_path, the actor's starting weights
        ranks_on_node = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        kwargs = dict(model=model_path, skip_tokenizer_init=True, dtype=self.dtype, seed=int(seed),
                      max_model_len=spec.max_model_len, max_num_seqs=spec.max_num_seqs,
                      max_num_batched_tokens=max(spec.max_num_batched_tokens, spec.max_model_len),
                      enable_prefix_caching=spec.enable_prefix_caching, enforce_eager=spec.enforce_eager,
                      tensor_parallel_size=1, trust_remote_code=trust_remote_code,
                      logprobs_mode="processed_logprobs")  # after temperature / top-k / top-p, as sampled
        if device.type == "cpu":
            if "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
                os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cpu_bind(local_rank, ranks_on_node,
                                                                   sorted(os.sched_getaffinity(0)))
            from transformers import AutoConfig
            import psutil
            hf_config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
            kwargs["kv_cache_memory_bytes"] = kv_cache_bytes(hf_config, spec, self.dtype, ranks_on_node,
                                                             psutil.virtual_memory().total)
        else:
            kwargs["gpu_memory_utilization"] = spec.gpu_memory_utilization
        from vllm import LLM
        self.llm = LLM(**kwargs)

    # ------------------------------------------------------------ weights

    def weights_changed(self) -> None:
        self.stale = True

    def _weights(self) -> Iterator[Tuple[str, torch.Tensor]]:
        """(HF name, full tensor in the rollout dtype), one parameter at a time; every rank of the actor's
        mesh walks the same names in the same order (a DTensor's gather is a collective)."""
        for name, param in self.actor.module.named_parameters(remove_duplicate=False):
            full = param.full_tensor() if isinstance(param, DTensor) else param
            yield name, full.detach().to(self.dtype)

    def sync_weights(self) -> None:
        """Stream the actor's current weights into the engine (tied weights under each of their names)."""
        self.llm.collective_rpc("reload_weights",
                                kwargs={"weights_iterator": self._weights(), "is_checkpoint_format": True})
        self.stale = False

    # ------------------------------------------------------------ sampling

    def _params(self, sampling, seed: int, eos_id):
        from vllm import SamplingParams
        greedy = sampling.temperature <= 0
        return SamplingParams(
            n=1, max_tokens=sampling.max_tokens, temperature=0.0 if greedy else sampling.temperature,
            top_p=1.0 if greedy else sampling.top_p, top_k=0 if greedy or sampling.top_k <= 0 else sampling.top_k,
            min_p=0.0 if greedy else sampling.min_p, seed=int(seed),
            # no eos_id: run to max_tokens, as the HF backend does (vLLM would stop at the checkpoint's EOS)
            stop_token_ids=[int(eos_id)] if eos_id is not None else None, ignore_eos=eos_id is None,
            logprobs=0 if self.settings.returns_log_probs else None, detokenize=False)

    def generate(self, prompts, sampling, seeds, eos_id, pad_id) -> RolloutResult:
        if self.stale:  # first, even with no prompts: the gathers are collectives over the actor's mesh
            self.sync_weights()
        if not prompts:
            return RolloutResult([], [] if self.settings.returns_log_probs else None)
        requests = [{"prompt_token_ids": p.reshape(-1).tolist()} for p in prompts]
        params = [self._params(sampling, s, eos_id) for s in seeds]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        responses, log_probs = [], []
        for out in outputs:
            done = out.outputs[0]
            ids = list(done.token_ids)
            responses.append(token_ids(ids))
            if self.settings.returns_log_probs:
                log_probs.append(torch.tensor([step[t].logprob for step, t in zip(done.logprobs, ids)],
                                              dtype=torch.float32))
        return RolloutResult(responses, log_probs if self.settings.returns_log_probs else None)

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            del llm

