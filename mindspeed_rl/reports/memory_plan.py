"""Per-rank memory of a config's layout, and whether it fits a device.

    python -m mindspeed_rl.reports.memory_plan --config configs/grpo_qwen25_7b_A3.yaml [--device-gb 64 80 141]

Parameters, gradients and optimizer state are counted with the engine's own
sharding rules (models/sharding.py: the model config's TP plan, then FSDP's
dim-0 split), on a meta-device model of the section's family (transformers'
own class: all parameters, MoE experts included); a test holds these counts
to the bytes the engine really allocates. Activations are an estimate. With
TP > 1, what of the model's TP plan runs replicated over tp is listed, one line
per module pattern (sharding.replicated_over_tp).
"""
import argparse
import sys
import warnings
from dataclasses import dataclass
from typing import List, Tuple

GB = 1024 ** 3


@dataclass
class MemoryPlan:
    params: int        # fp32 master weights
    grads: int         # fp32 gradients
    optimizer: int     # AdamW moments (fp32, two per parameter)
    reference: int     # frozen reference model (compute dtype)
    gathered: int      # weights all-gathered for log-probs / generate (compute dtype, FSDP only)
    activations: int   # estimate at max_packing_token_size
    replicated: Tuple[str, ...] = ()  # lines: TP-plan modules that stay replicated over tp

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.reference + self.gathered + self.activations


def meta_model(actor_config, value_head: bool = False):
    """The model of the config's model section, on the meta device (no memory); ``value_head``: the
    critic's token-classification model with one output."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    from mindspeed_rl.config_cls.model_arch import hf_config_kwargs
    kwargs = hf_config_kwargs(actor_config)
    if not kwargs:
        raise ValueError("memory_plan needs a model section (configs/model/<name>.yaml) in the config")
    family = kwargs.pop("model_type")
    with torch.device("meta"):
        if value_head:
            return AutoModelForTokenClassification.from_config(AutoConfig.for_model(family, num_labels=1, **kwargs))
        return AutoModelForCausalLM.from_config(AutoConfig.for_model(family, **kwargs))


def _role(cfgs, role: str):
    """(config, layout) of the worker group ``role`` ('actor' or 'critic')."""
    if role == "critic":
        return cfgs.critic_config, cfgs.plan.critic.layout
    return cfgs.actor_config, cfgs.plan.layout


def plan_memory(cfgs, role: str = "actor") -> MemoryPlan:
    """Per-rank memory of the worker group ``role`` ('actor': actor + reference; 'critic': PPO's value model)."""
    from mindspeed_rl.models.sharding import planned_local_numel, replicated_lines, tp_plan
    rl = cfgs.rl_config
    actor, layout = _role(cfgs, role)
    critic = role == "critic"
    model = meta_model(actor, value_head=critic)
    fsdp = layout.engine == "fsdp"
    plan = tp_plan(model)  # the model config's own TP plan, as the engine applies it
    shapes = [(n, tuple(p.shape)) for n, p in model.named_parameters()]  # tied weights counted once
    local = sum(planned_local_numel(n, s, layout.dp, layout.tp, fsdp=fsdp, plan=plan) for n, s in shapes)
    full_tp = sum(planned_local_numel(n, s, layout.dp, layout.tp, fsdp=False, plan=plan) for n, s in shapes)
    compute = 2 if actor.bf16 else 4
    cfg = model.config
    tokens = rl.max_packing_token_size if rl.use_dynamic_bsz else actor.seq_length * actor.micro_batch_size
    # saved activations per token and layer ~ 34 * hidden bytes (bf16, no recompute), split over TP,
    # plus fp32 logits and their log-softmax over the vocabulary
    activations = int(34 * cfg.hidden_size * cfg.num_hidden_layers * tokens * compute / 2 / layout.tp
                      + (0 if critic else 2 * 4 * tokens * cfg.vocab_size))
    return MemoryPlan(params=4 * local, grads=4 * local, optimizer=8 * local,
                      reference=compute * local if cfgs.plan.uses_reference and not critic else 0,
                      gathered=compute * full_tp if fsdp else 0, activations=activations,
                      replicated=tuple(replicated_lines(model)) if layout.tp > 1 else ())


def table(name: str, cfgs, plan: MemoryPlan, device_gbs: List[float], role: str = "actor") -> str:
    layout = _role(cfgs, role)[1]
    rows = [f"{name}: DP={layout.dp} TP={layout.tp} ({layout.world_size} devices, {layout.engine} engine), "
            f"per rank:",
            f"  {'parameters (fp32)':34s}{plan.params / GB:8.2f} GB",
            f"  {'gradients (fp32)':34s}{plan.grads / GB:8.2f} GB",
            f"  {'optimizer state (AdamW, fp32)':34s}{plan.optimizer / GB:8.2f} GB",
            f"  {'reference model':34s}{plan.reference / GB:8.2f} GB",
            f"  {'gathered weights (log-prob/gen)':34s}{plan.gathered / GB:8.2f} GB",
            f"  {'activations (estimate)':34s}{plan.activations / GB:8.2f} GB",
            f"  {'total':34s}{plan.total / GB:8.2f} GB"]
    rows.append("  fits: " + ", ".join(f"{gb:g} GB {'yes' if plan.total <= gb * GB else 'NO'}" for gb in device_gbs))
    rows += [f"  {line}" for line in plan.replicated]
    return "\n".join(rows)


def _is_override(arg: str) -> bool:
    """``section.key=value`` (not an option, not a path)."""
    name = arg.split("=", 1)[0]
    return "=" in arg and not arg.startswith("-") and bool(name) and all(
        part.isidentifier() for part in name.split("."))


def parse_args(argv=None) -> argparse.Namespace:
    """Options and ``section.key=value`` overrides in any order (an override after
    ``--device-gb`` or between configs is an override, not a size or a config)."""
    parser = argparse.ArgumentParser(description="Per-rank memory of a GRPO config's layout.")
    parser.add_argument("--config", required=True, nargs="+", help="one or more YAML configs")
    parser.add_argument("--device-gb", type=float, nargs="+", default=[64.0], help="device memory sizes to check")
    parser.add_argument("overrides", nargs="*", default=[],
                        help="section.key=value config overrides, anywhere on the line")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args([a for a in argv if not _is_override(a)])
    args.overrides = [a for a in argv if _is_override(a)]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from mindspeed_rl.plan import build_configs, load_config
    fits = True
    for path in args.config:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # unimplemented-key notes are not about memory
                cfgs = build_configs(load_config(path, args.overrides))
            plans = {role: plan_memory(cfgs, role) for role in cfgs.plan.roles}
        except (ValueError, TypeError, FileNotFoundError) as err:
            print(f"error: {path}: {err}", file=sys.stderr)
            return 2
        for role, plan in plans.items():
            print(table(path if role == "actor" else f"{path} (critic)", cfgs, plan, args.device_gb, role))
            fits = fits and plan.total <= min(args.device_gb) * GB
    return 0 if fits else 1


if __name__ == "__main__":
    sys.exit(main())
