"""A HuggingFace causal LM wrapped for RL: scoring, training with micro-batches under DDP / FSDP, and sampling.

Samples are (prompt, response) pairs of 1-D token tensors; the model reads prompt + response and every response
token t is scored by the logits at t - 1. A micro-batch is a list of sample indexes run in one forward, either
packed into one row (use_remove_padding) or right padded.

With ``head="value"`` the same engine holds a value model (PPO's critic): the checkpoint is loaded as
transformers' ``<Family>ForTokenClassification`` with one output (the LM head dropped, a fresh ``score`` head
added) and response token t gets the value read at t - 1, the same alignment as its log-prob. Its loss_fn
receives per-sample values instead of log-probs (and None for entropies).

Gradient contract of `compute_grads` / `train_step`: for every micro-batch loss_fn returns the SUM of its
per-token losses; the engine back-propagates `loss_sum * dp_size / token_count` where token_count is the
response-token count of the whole mini-batch over all data-parallel ranks. DDP averages over the dp_size ranks,
so the final gradient is (sum of all per-token losses) / token_count whatever the split of samples over ranks
and micro-batches. Every rank must run the same number of micro-batches (empty ones allowed).
"""
import contextlib
import math
import warnings
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification, GenerationConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING

from mindspeed_rl.models import sharding
from mindspeed_rl.models.packing import (
    block_causal_mask,
    pack_sequences,
    pad_sequences,
    response_log_probs_from_logits,
    response_values_from_outputs,
)
from mindspeed_rl.utils.token_ids import TOKEN_DTYPE

# loss_fn(sample_indexes, log_probs, entropies) -> (loss_sum, metrics); a value engine passes (indexes, values, None)
LossFn = Callable[[List[int], List[Tensor], Optional[List[Tensor]]], Tuple[Tensor, Dict[str, float]]]
HEADS = ("lm", "value")


def load_value_model(model_path: str, **load_kwargs) -> torch.nn.Module:
    """The checkpoint as a one-output token-classification model (LM head dropped, new ``score`` head).

    The head's dropout is off, so training forwards are deterministic and equal on every rank.
    """
    trust = bool(load_kwargs.get("trust_remote_code", False))
    config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust)
    remote = trust and "AutoModelForTokenClassification" in (getattr(config, "auto_map", None) or {})
    if type(config) not in MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING and not remote:
        raise ValueError(f"model family {config.model_type!r} has no ForTokenClassification class in the "
                         f"installed transformers, so it cannot be loaded as a value model")
    config.num_labels = 1
    config.classifier_dropout = 0.0
    from transformers.utils import logging as hf_logging
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # transformers' load report lists the new head as MISSING: expected here
    try:
        model, info = AutoModelForTokenClassification.from_pretrained(model_path, config=config,
                                                                      output_loading_info=True, **load_kwargs)
    finally:
        hf_logging.set_verbosity(verbosity)
    missing = [k for k in info.get("missing_keys", ()) if not k.startswith("score.")]
    if missing:  # only the value head may be new: anything else means the weights are not this family's
        raise ValueError(f"the value model loaded from {model_path!r} lacks weights beyond its new value head: "
                         f"{sorted(missing)[:8]}")
    return model


def _to_float(value) -> float:
    # metric value (python number or 0-d tensor) -> float
    if isinstance(value, Tensor):
        return float(value.detach().float().mean().item())
    return float(value)


class CausalLMEngine:
    """One data-parallel replica of a causal LM (actor or reference) or of a value model (critic)."""

    def __init__(
        self,
        model_path: str,
        device: torch.device,
        dtype: torch.dtype = torch.float32,
        use_remove_padding: bool = False,
        attn_implementation: Optional[str] = None,
        trainable: bool = True,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        betas: Tuple[float, float] = (0.9, 0.999),
        clip_grad: float = 1.0,
        seed: int = 1234,
        process_group=None,
        pad_id: int = 0,
        autocast_dtype: Optional[torch.dtype] = None,
        lr_schedule: Optional[Callable[[int], float]] = None,
        eps: float = 1e-8,
        trust_remote_code: bool = False,
        mesh=None,
        fsdp: bool = False,
        head: str = "lm",
        metrics_prefix: Optional[str] = None,
    ):
        """``dtype`` is the weights' dtype; ``autocast_dtype`` (e.g. bf16 with
        fp32 weights) runs forwards in lower precision while the optimizer
        updates full-precision weights, so small updates are not rounded away.
        ``lr_schedule(step)`` gives the learning rate of each optimizer step
        (see models/lr_schedule.py); without it the rate stays ``lr``.
        ``mesh`` (a (dp, tp) DeviceMesh, models/sharding.py) shards the weights
        over tp with DTensor; ``fsdp`` also shards parameters, gradients and
        optimizer state over dp (FSDP2, bf16 compute via its mixed-precision
        policy when ``autocast_dtype`` is set); without ``fsdp`` gradients are
        averaged over dp. Without a mesh, DDP over ``process_group``.
        ``head`` is "lm" (causal LM) or "value" (value model, see the module
        docstring); ``metrics_prefix`` names train_step's metrics ("actor" for
        an LM, "critic" for a value model by default)."""
        if head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}, got {head!r}")
        self.head = head
        self.metrics_prefix = metrics_prefix or ("critic" if head == "value" else "actor")
        torch.manual_seed(seed)
        self.autocast_dtype = autocast_dtype
        self.device = torch.device(device)
        self.dtype = dtype
        self.use_remove_padding = use_remove_padding
        self.trainable = trainable
        self.clip_grad = clip_grad
        self.pad_id = int(pad_id)
        self.process_group = process_group

        load_kwargs = {"dtype": dtype, "trust_remote_code": trust_remote_code}
        if attn_implementation is not None:
            load_kwargs["attn_implementation"] = attn_implementation
        if head == "value":
            module = load_value_model(model_path, **load_kwargs)
        else:
            module = AutoModelForCausalLM.from_pretrained(model_path, **load_kwargs)
        module.to(self.device)
        module.requires_grad_(trainable)
        module.eval()
        self.module = module
        self.attn_implementation = getattr(module.config, "_attn_implementation", None) or "eager"

        # one path for every layout: sharding.parallelize over a (dp, tp) mesh; the DDP engine's
        # data-parallel group becomes a 1-D dp mesh (replicate, DDP semantics)
        self.fsdp = bool(fsdp and mesh is not None)
        if mesh is None and self._multi_rank(process_group) and trainable:
            mesh = sharding.mesh_from_group(process_group, self.device.type)
        self.mesh = mesh
        self.is_ddp = mesh is not None and not self.fsdp and sharding.mesh_dim(mesh, "dp") is not None
        if mesh is not None:
            spec = sharding.ParallelSpec(fsdp=self.fsdp, param_dtype=autocast_dtype if self.fsdp else None)
            if trainable or self.fsdp or sharding.mesh_dim(mesh, "tp") is not None:
                sharding.parallelize(module, mesh, spec)
            if self.fsdp:
                self.autocast_dtype = None  # FSDP's policy casts for compute; no autocast on top

        self.optimizer = None
        self.lr_schedule = lr_schedule
        self.steps = 0
        self.skipped_steps = 0
        if trainable:
            params = [p for p in module.parameters() if p.requires_grad]
            meshes = {p.device_mesh for p in params if isinstance(p, sharding.DTensor)}
            self.optimizer = torch.optim.AdamW(
                params,
                lr=lr_schedule(0) if lr_schedule else lr,
                betas=tuple(betas),
                eps=eps,
                weight_decay=weight_decay,
                foreach=False if len(meshes) > 1 else None,  # foreach cannot mix DTensor meshes
            )

    @staticmethod
    def _multi_rank(group) -> bool:
        return (group is not None and dist.is_available() and dist.is_initialized()
                and dist.get_world_size(group) > 1)

    def _gathered(self):
        """All-gather FSDP shards once around a run of forwards (log-probs, generate)."""
        return sharding.gathered(self.module) if self.fsdp else contextlib.nullcontext()

    # ------------------------------------------------------------------ forward helpers

    def _autocast(self):
        if self.autocast_dtype is None or self.autocast_dtype == self.dtype:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    @property
    def _flash(self) -> bool:
        # flash attention separates packed sequences from position_ids alone
        return "flash" in str(self.attn_implementation)

    def _sequences(self, prompts: Sequence[Tensor], responses: Sequence[Tensor], indexes: List[int]):
        # prompt + response on device, with prompt and response lengths
        seqs, p_lens, r_lens = [], [], []
        for i in indexes:
            p = prompts[i].reshape(-1).to(self.device, torch.long)
            r = responses[i].reshape(-1).to(self.device, torch.long)
            if p.numel() == 0:
                raise ValueError(f"sample {i} has an empty prompt; a response needs a preceding token")
            seqs.append(torch.cat([p, r]))
            p_lens.append(p.numel())
            r_lens.append(r.numel())
        return seqs, p_lens, r_lens

    def _need(self, head: str, what: str) -> None:
        if self.head != head:
            raise RuntimeError(f"{what} needs a head={head!r} engine; this one has head={self.head!r}")

    def _forward(self, model: torch.nn.Module, prompts: Sequence[Tensor], responses: Sequence[Tensor],
                 indexes: List[int]) -> Tuple[Tensor, Tensor, List[int], List[int]]:
        """One forward of the micro-batch: (head output (B, T, n), input_ids, flat response starts, lengths)."""
        seqs, p_lens, r_lens = self._sequences(prompts, responses, indexes)
        if self.use_remove_padding:
            input_ids, position_ids, cu_seqlens = pack_sequences(seqs)
            kwargs = {"input_ids": input_ids, "position_ids": position_ids, "use_cache": False}
            if not self._flash:
                kwargs["attention_mask"] = block_causal_mask(cu_seqlens, self.dtype, self.device)
            starts = [int(cu_seqlens[k]) + p_lens[k] for k in range(len(seqs))]
        else:
            input_ids, attention_mask = pad_sequences(seqs, self.pad_id)
            width = input_ids.shape[1]
            kwargs = {"input_ids": input_ids, "attention_mask": attention_mask, "use_cache": False}
            starts = [k * width + p_lens[k] for k in range(len(seqs))]
        with self._autocast(), warnings.catch_warnings():
            # FSDP2 warns when a root module returns a view (the value head's (B, T, 1) output is one);
            # the engine only reads head outputs out of place, so its hooks are safe
            warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
            out = model(**kwargs).logits
        return out, input_ids, starts, r_lens

    def _micro_batch_scores(
        self,
        model: torch.nn.Module,
        prompts: Sequence[Tensor],
        responses: Sequence[Tensor],
        indexes: List[int],
        with_entropy: bool,
        temperature: float,
    ) -> Tuple[List[Tensor], Optional[List[Tensor]]]:
        """One forward of the micro-batch; per-sample response log-probs (and entropies) in `indexes` order."""
        logits, input_ids, starts, r_lens = self._forward(model, prompts, responses, indexes)
        out = response_log_probs_from_logits(
            logits, input_ids, starts, r_lens, with_entropy=with_entropy, temperature=temperature
        )
        if with_entropy:
            return out[0], out[1]
        return out, None

    def _micro_batch_values(self, model: torch.nn.Module, prompts: Sequence[Tensor], responses: Sequence[Tensor],
                            indexes: List[int]) -> List[Tensor]:
        """One forward of the micro-batch; per-sample response-token values (float32) in `indexes` order."""
        outputs, _, starts, r_lens = self._forward(model, prompts, responses, indexes)
        return response_values_from_outputs(outputs, starts, r_lens)

    def _empty_loss(self) -> Tensor:
        # zero loss that still touches every parameter, so DDP sees a normal backward
        ids = torch.full((1, 1), self.pad_id, dtype=torch.long, device=self.device)
        with self._autocast():
            logits = self.module(input_ids=ids, use_cache=False).logits
        return logits.float().sum() * 0.0

    # ------------------------------------------------------------------ scoring

    @torch.no_grad()
    def log_probs(
        self,
        prompts: List[Tensor],
        responses: List[Tensor],
        micro_batches: List[List[int]],
        with_entropy: bool = False,
        temperature: float = 1.0,
    ) -> Tuple[List[Tensor], Optional[List[Tensor]]]:
        """Response-token log-probs (and entropies) per sample, in the original sample order, as CPU float32.

        Each non-empty micro-batch is one forward of the unwrapped module (no DDP traffic).
        Samples not named in any micro-batch get None.
        """
        self._need("lm", "log_probs")
        self.module.eval()
        log_probs: List[Optional[Tensor]] = [None] * len(responses)
        entropies: Optional[List[Optional[Tensor]]] = [None] * len(responses) if with_entropy else None
        with self._gathered():
            for mb in micro_batches:
                mb = [int(i) for i in mb]
                if not mb:
                    continue
                lps, ents = self._micro_batch_scores(self.module, prompts, responses, mb, with_entropy, temperature)
                for k, i in enumerate(mb):
                    log_probs[i] = lps[k].detach().cpu()
                    if with_entropy:
                        entropies[i] = ents[k].detach().cpu()
        return log_probs, entropies

    @torch.no_grad()
    def values(
        self,
        prompts: List[Tensor],
        responses: List[Tensor],
        micro_batches: List[List[int]],
    ) -> List[Optional[Tensor]]:
        """Value of every response token per sample (value engine), in the original sample order, as CPU float32.

        The value of response token j is the head output at the position before it. Samples not named in
        any micro-batch get None.
        """
        self._need("value", "values")
        self.module.eval()
        out: List[Optional[Tensor]] = [None] * len(responses)
        with self._gathered():
            for mb in micro_batches:
                mb = [int(i) for i in mb]
                if not mb:
                    continue
                for i, v in zip(mb, self._micro_batch_values(self.module, prompts, responses, mb)):
                    out[i] = v.detach().cpu()
        return out

    # ------------------------------------------------------------------ training

    def _trainable_params(self) -> List[torch.nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def zero_grad(self) -> None:
        for p in self.module.parameters():
            p.grad = None

    def compute_grads(
        self,
        prompts: List[Tensor],
        responses: List[Tensor],
        micro_batches: List[List[int]],
        loss_fn: LossFn,
        token_count: float,
        dp_size: int = 1,
        with_entropy: bool = True,
        temperature: float = 1.0,
    ) -> Dict[str, float]:
        """Clear grads, then forward + backward every micro-batch; grads are left in `param.grad`.

        Data-parallel gradients are reduced once, on the last micro-batch. An empty micro-batch runs a zero
        loss so every rank runs the same number of backward passes. Returns loss_fn's metrics averaged over the non-empty micro-batches.
        A value engine calls loss_fn(indexes, values, None) (with_entropy and temperature are unused).
        """
        if not self.trainable:
            raise RuntimeError("this engine was built with trainable=False")
        self.module.train()
        self.zero_grad()
        mbs = [[int(i) for i in mb] for mb in micro_batches] or [[]]
        scale = float(dp_size) / float(token_count) if token_count > 0 else 0.0
        sums: Dict[str, float] = {}
        counts: Dict[str, int] = {}
        for k, mb in enumerate(mbs):
            last = k == len(mbs) - 1
            if isinstance(self.module, sharding.FSDPModule):
                self.module.set_requires_gradient_sync(last)  # reduce once, after the last
            if mb:
                if self.head == "value":
                    outs, ents = self._micro_batch_values(self.module, prompts, responses, mb), None
                else:
                    outs, ents = self._micro_batch_scores(
                        self.module, prompts, responses, mb, with_entropy, temperature
                    )
                loss_sum, metrics = loss_fn(mb, outs, ents)
                for key, value in (metrics or {}).items():
                    sums[key] = sums.get(key, 0.0) + _to_float(value)
                    counts[key] = counts.get(key, 0) + 1
            else:
                loss_sum = self._empty_loss()
            (loss_sum * scale).backward()
        sharding.sync_tp_grads(self.module)
        return {key: sums[key] / counts[key] for key in sums}

    def train_step(
        self,
        prompts: List[Tensor],
        responses: List[Tensor],
        micro_batches: List[List[int]],
        loss_fn: LossFn,
        token_count: float,
        dp_size: int = 1,
        with_entropy: bool = True,
        temperature: float = 1.0,
    ) -> Dict[str, float]:
        """One optimizer step over the mini-batch: compute_grads, clip, AdamW step, clear grads.

        A non-finite grad norm skips the optimizer step (counted in "<prefix>/skipped_steps", cumulative).
        Adds "<prefix>/grad_norm", "<prefix>/lr" and "<prefix>/skipped_steps" to the metrics, <prefix>
        being ``metrics_prefix`` ("actor" or "critic").
        """
        metrics = self.compute_grads(
            prompts, responses, micro_batches, loss_fn, token_count, dp_size, with_entropy, temperature
        )
        params = self._trainable_params()
        max_norm = self.clip_grad if self.clip_grad and self.clip_grad > 0 else float("inf")
        grad_norm = sharding.clip_grads(params, max_norm, self.mesh)
        prefix = self.metrics_prefix
        metrics[f"{prefix}/lr"] = float(self.optimizer.param_groups[0]["lr"])
        if math.isfinite(grad_norm):
            self.optimizer.step()
        else:
            self.skipped_steps += 1  # a non-finite gradient norm: no update
        metrics[f"{prefix}/skipped_steps"] = float(self.skipped_steps)
        self.zero_grad()
        self.steps += 1
        if self.lr_schedule is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = self.lr_schedule(self.steps)
        metrics[f"{prefix}/grad_norm"] = grad_norm
        return metrics

    # ------------------------------------------------------------------ sampling

    def _fork_rng(self):
        # keep the global RNG untouched by a seeded generate
        if self.device.type == "cpu":
            return torch.random.fork_rng(devices=[])
        index = self.device.index if self.device.index is not None else 0
        return torch.random.fork_rng(devices=[index], device_type=self.device.type)

    @torch.no_grad()
    def generate(
        self,
        prompts: List[Tensor],
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        eos_id: Optional[int] = None,
        pad_id: Optional[int] = None,
        seed: Optional[int] = None,
        min_p: float = 0.0,
        with_log_probs: bool = False,
    ):
        """Sample (greedy when temperature == 0) a response per prompt; CPU int32 tensors (TOKEN_DTYPE).

        Each response holds the new tokens up to and including the first EOS, or max_new_tokens tokens.
        Only the given sampling settings apply (the checkpoint's generation_config is ignored).
        ``with_log_probs``: returns (responses, log-probs), each sampled token's log-prob under the distribution
        it was sampled from (after temperature / top-k / top-p), float32 per response; it keeps every step's
        scores (batch x steps x vocab) until the end of the call.
        """
        self._need("lm", "generate")
        if len(prompts) == 0:
            return ([], []) if with_log_probs else []
        pad = self.pad_id if pad_id is None else int(pad_id)
        seqs = [p.reshape(-1).to(self.device, torch.long) for p in prompts]
        input_ids, attention_mask = pad_sequences(seqs, pad, padding_side="left")
        width = input_ids.shape[1]

        greedy = temperature is None or temperature <= 0
        gen_kwargs = {
            "max_new_tokens": int(max_new_tokens),
            "do_sample": not greedy,
            "pad_token_id": pad,
            "eos_token_id": eos_id,
            "use_cache": True,
        }
        if not greedy:
            gen_kwargs.update(temperature=float(temperature), top_p=float(top_p), top_k=int(top_k or 0))
            if min_p:
                gen_kwargs["min_p"] = float(min_p)

        self.module.eval()
        saved_config = self.module.generation_config
        # a blank generation config so checkpoint defaults (top_k, repetition_penalty, ...) do not leak in
        self.module.generation_config = GenerationConfig()
        try:
            rng = self._fork_rng() if seed is not None else contextlib.nullcontext()
            with rng, self._autocast(), self._gathered():
                if seed is not None:
                    torch.manual_seed(int(seed))
                out = self.module.generate(input_ids=input_ids, attention_mask=attention_mask,
                                           output_scores=with_log_probs, return_dict_in_generate=with_log_probs,
                                           **gen_kwargs)
        finally:
            self.module.generation_config = saved_config

        sequences = out.sequences if with_log_probs else out
        new_tokens = sequences[:, width:]
        sampled = None
        if with_log_probs:  # step t's processed scores, at the token sampled at step t
            sampled = torch.stack([torch.log_softmax(step.float(), dim=-1).gather(1, new_tokens[:, t:t + 1])[:, 0]
                                   for t, step in enumerate(out.scores)], dim=1).cpu()
        results, log_probs = [], []
        for i, row in enumerate(new_tokens.to("cpu", TOKEN_DTYPE)):
            keep = int(max_new_tokens)
            if eos_id is not None:
                hits = (row == int(eos_id)).nonzero()
                if hits.numel() > 0:
                    keep = min(keep, int(hits[0, 0]) + 1)
            results.append(row[:keep].clone())
            if sampled is not None:
                log_probs.append(sampled[i, :keep].clone())
        return (results, log_probs) if with_log_probs else results

    # ------------------------------------------------------------------ saving

    def set_step(self, steps: int) -> None:
        """Resume the LR schedule at optimizer step ``steps``."""
        self.steps = int(steps)
        if self.lr_schedule is not None and self.optimizer is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = self.lr_schedule(self.steps)

    def save_sharded(self, path: str, with_optimizer: bool = True) -> None:
        """Model (and optimizer) state with torch.distributed.checkpoint; every rank writes its shards."""
        import torch.distributed.checkpoint as dcp
        dcp.save(self._dcp_state(with_optimizer), checkpoint_id=path)

    def load_sharded(self, path: str, with_optimizer: bool = True) -> None:
        """Load what ``save_sharded`` wrote into this engine's (sharded) model and optimizer."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict
        state = self._dcp_state(with_optimizer)
        dcp.load(state, checkpoint_id=path)
        set_state_dict(self.module, self.optimizer if (with_optimizer and self.optimizer is not None) else [],
                       model_state_dict=state["model"], optim_state_dict=state.get("optim", {}))

    def _dcp_state(self, with_optimizer: bool) -> Dict[str, dict]:
        from torch.distributed.checkpoint.state_dict import get_state_dict
        optimizers = self.optimizer if (with_optimizer and self.optimizer is not None) else []
        model_state, optim_state = get_state_dict(self.module, optimizers)
        return {"model": model_state, **({"optim": optim_state} if optimizers else {})}

    def state_dict_for_save(self) -> Dict[str, Tensor]:
        """Full state dict of the unwrapped module (no DDP prefix). When sharded,
        shards are gathered (every rank calls it) and only global rank 0 gets them."""
        if self.fsdp or sharding.mesh_dim(self.mesh, "tp") is not None:
            return sharding.full_state_dict(self.module)
        # unsharded or replicated: every rank holds the full values
        return {k: sharding.local(v) for k, v in self.module.state_dict().items()}

    def save(self, path: str) -> None:
        """save_pretrained of the full model; every rank calls it, global rank 0 writes."""
        state = self.state_dict_for_save()
        if not dist.is_initialized() or dist.get_rank() == 0:
            self.module.save_pretrained(path, state_dict=state)
