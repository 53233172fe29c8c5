"""Rollout through an in-process vLLM engine colocated with the rank's training engine (hybrid engine).

The engine loads the actor's checkpoint once; after the actor's weights change (an update, a checkpoint
load) the next ``generate`` first streams them into the engine one parameter at a time (gathered from the
FSDP / TP shards, cast to the rollout dtype), so every rollout samples from the policy being trained.
Each prompt gets its own sampling seed, so a row's response does not depend on what it is batched with.
"""
import logging
import math
import os
import time
import warnings
from typing import Dict, Iterator, List, Tuple

import torch
from torch.distributed.tensor import DTensor

from mindspeed_rl.models.rollout.base import ROLLOUT_BUDGET, RolloutBackend, RolloutResult, Served
from mindspeed_rl.models.rollout.registry import register_backend
from mindspeed_rl.balance.rollout_queue import COMPLETE, CUT, RUNNING
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


def quiet_vllm_import() -> None:
    """Before vLLM is imported: its import-time notices that say nothing about this run off (the CPU build's
    "Triton ... Disabling Triton" goes out before vLLM's log level applies; its Triton shim touches a
    deprecated torch alias), unless VLLM_LOGGING_LEVEL asks for them."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    level = logging.getLevelName(os.environ["VLLM_LOGGING_LEVEL"].upper())
    if isinstance(level, int) and level > logging.WARNING:
        logging.getLogger("vllm.triton_utils.importing").setLevel(level)
        warnings.filterwarnings("ignore", message=r".*torch\.distributed\.reduce_op.*", category=FutureWarning)


@register_backend("vllm")
class VLLMRollout(RolloutBackend):
    name = "vllm"

    def __init__(self, spec, actor, model_path: str, device, rank: int, world_size: int, seed: int,
                 trust_remote_code: bool = False):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine lives in this process
        quiet_vllm_import()  # vLLM's start-up chatter off unless asked for
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
                      use_tqdm_on_load=False,  # no progress bar for a one-shard tiny load on every start
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
            # a seeded request whose prefill is split over steps stops vLLM's CPU build ("CPU Generator does
            # not use offset"): prompts are prefilled whole (max_num_batched_tokens >= max_model_len above)
            kwargs["enable_chunked_prefill"] = False
        else:
            kwargs["gpu_memory_utilization"] = spec.gpu_memory_utilization
        from pydantic import ValidationError
        from vllm import LLM
        try:
            self.llm = LLM(**kwargs)
        except ValidationError as err:  # not picklable: Ray could not carry it to the driver
            raise ValueError("vLLM refused its engine settings: " + " ".join(
                " ".join(str(e.get("msg", e)).split()) for e in err.errors())) from None

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

    def _params(self, sampling, seed: int, eos_id, budget=None):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind
        greedy = sampling.temperature <= 0
        return SamplingParams(
            n=1, max_tokens=sampling.max_tokens if budget is None else int(budget),
            temperature=0.0 if greedy else sampling.temperature,
            top_p=1.0 if greedy else sampling.top_p, top_k=0 if greedy or sampling.top_k <= 0 else sampling.top_k,
            min_p=0.0 if greedy else sampling.min_p, seed=int(seed),
            # no eos_id: run to max_tokens, as the HF backend does (vLLM would stop at the checkpoint's EOS)
            stop_token_ids=[int(eos_id)] if eos_id is not None else None, ignore_eos=eos_id is None,
            logprobs=0 if self.settings.returns_log_probs else None, detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY)  # a request's output once, when it finishes

    def _response(self, output) -> Tuple[torch.Tensor, torch.Tensor]:
        """(response tokens, their log-probs or None) of a finished request."""
        done = output.outputs[0]
        ids = list(done.token_ids)
        if not self.settings.returns_log_probs:
            return token_ids(ids), None
        return token_ids(ids), torch.tensor([step[t].logprob for step, t in zip(done.logprobs, ids)],
                                            dtype=torch.float32)

    def prepare(self) -> None:
        if self.stale:  # a collective over the actor's mesh: every rank syncs before it takes rows
            self.sync_weights()

    def generate(self, prompts, sampling, seeds, eos_id, pad_id, budgets=None) -> RolloutResult:
        self.prepare()  # first, even with no prompts
        if not prompts:
            return RolloutResult([], [] if self.settings.returns_log_probs else None)
        requests = [{"prompt_token_ids": p.reshape(-1).tolist()} for p in prompts]
        params = [self._params(sampling, s, eos_id, budgets[i] if budgets else None) for i, s in enumerate(seeds)]
        made = [self._response(out) for out in self.llm.generate(requests, params, use_tqdm=False)]
        return RolloutResult([r for r, _ in made],
                             [lp for _, lp in made] if self.settings.returns_log_probs else None)

    def serve(self, source, sampling, seed_of, eos_id, pad_id, chunk, clock=time.perf_counter) -> Served:
        """Continuous batching over the queue: requests join the running engine between steps, up to
        ``max_num_seqs`` live; after every step the free slots are asked for, with the progress of this
        engine's rows (tokens so far, final lengths: the queue's evidence of which groups run long). The answer
        is read between later steps, so the engine never waits on the queue while it has work. ``chunk`` is not
        used: the queue caps a take."""
        self.prepare()
        if self.agent is not None:  # multi-turn: every turn a request, tools beside the engine
            from mindspeed_rl.models.rollout.vllm_agent import serve_conversations
            return serve_conversations(self, self.agent, source, sampling, seed_of, eos_id, clock)
        engine, cap = self.llm.llm_engine, self.settings.max_num_seqs
        out = Served(log_probs=[] if self.settings.returns_log_probs else None)
        # request id -> [row, position, admitted at (s), admitted at (step), prompt tokens, token budget]
        live: Dict[str, list] = {}
        finished: List[Tuple[int, int, int]] = []  # (position, length, state) since the last take went out
        prefill, steps, begin = 0, 0, clock()

        def progress():
            report = [(v[1], steps - v[3], RUNNING) for v in live.values()] + finished
            finished.clear()
            return report

        while True:
            if len(live) < cap:
                source.request(cap - len(live), progress)
            got = source.poll(block=not live)
            if got:
                now = clock()
                budgets = got.inputs.get(ROLLOUT_BUDGET) or [None] * len(got.ids)
                for row, position, prompt, budget in zip(got.ids, got.positions, got.inputs["prompts"], budgets):
                    rid = f"row{row}"
                    engine.add_request(rid, {"prompt_token_ids": prompt.reshape(-1).tolist()},
                                       self._params(sampling, seed_of(row), eos_id, budget))
                    live[rid] = [row, position, now, steps, prompt.numel(), budget]
                    prefill += prompt.numel()
            if not live:
                if source.drained:
                    break
                continue
            count, start = len(live), clock()
            done = [o for o in engine.step() if o.finished]
            end = clock()
            steps += 1
            out.trace.append((1, count, prefill, end - start))
            prefill = 0
            for output in done:
                row, position, admitted, _, prompt_length, budget = live.pop(output.request_id)
                response, log_probs = self._response(output)
                # complete: stopped at EOS, or short of its pass budget; cut: the budget ran out
                ended = output.outputs[0].finish_reason == "stop" or (budget is not None and
                                                                      response.numel() < int(budget))
                finished.append((position, response.numel(), COMPLETE if ended else CUT))
                out.rows.append(row)
                out.prompt_lengths.append(prompt_length)
                out.responses.append(response)
                out.latency.append(end - admitted)
                if out.log_probs is not None:
                    out.log_probs.append(log_probs)
        out.busy = clock() - begin
        return out

    def close(self) -> None:
        self.llm = None  # the engine goes with its last reference

