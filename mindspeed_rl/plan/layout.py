"""Layout checks: the DP x TP layout of a worker group from its devices and parallel sizes (pipeline, context and
expert parallel folded into DP), the rollout layout, TP against the model's family, upstream's update fetch size."""
import sys
import warnings

from mindspeed_rl.config_cls.rl_config import resource_size
from mindspeed_rl.plan.plan_types import FOLDED, SUPPORTED_LAYOUTS, Layout, PlanError


def check_rollout_layout(actor_config, generate_config):
    if generate_config.infer_pipeline_parallel_size != 1:
        raise PlanError(f"generate_config.infer_pipeline_parallel_size="
                        f"{generate_config.infer_pipeline_parallel_size} is not implemented; rollout runs "
                        f"on the actor's layout ({SUPPORTED_LAYOUTS})")
    infer_tp = generate_config.infer_tensor_parallel_size
    if infer_tp != actor_config.tensor_model_parallel_size:
        warnings.warn(f"generate_config.infer_tensor_parallel_size={infer_tp} is not implemented: rollout runs "
                      f"on the actor's layout (tensor_model_parallel_size="
                      f"{actor_config.tensor_model_parallel_size}; with vLLM every rank's engine holds the whole "
                      f"model, inference TP across ranks is not implemented)", UserWarning, stacklevel=3)


def check_layout(actor_config, resource, section: str = "actor_config", resource_key: str = "actor_resource",
                  given_dp=None) -> Layout:
    """The DP x TP layout of one worker group: ``resource`` devices (rl_config.<resource_key>) split
    by the TP of its config ``section``; PP / CP / EP folded into DP."""
    world = resource_size(resource)
    if world is None:
        raise PlanError(f"rl_config.{resource_key}.num_npus is not set; the run plan needs the device count")
    if world < 1:
        raise PlanError(f"rl_config.{resource_key}.num_npus={world} must be at least 1 (a worker per device)")
    tp = actor_config.tensor_model_parallel_size
    if tp < 1 or world % tp:
        raise PlanError(f"rl_config.{resource_key}.num_npus={world} must be divisible by "
                        f"{section}.tensor_model_parallel_size={tp}")
    folded = {key: getattr(actor_config, key) for key in FOLDED}
    for key, value in folded.items():
        if not isinstance(value, int) or value < 1:
            raise PlanError(f"{section}.{key}={value!r} must be a positive int")
    pp, cp, ep = (folded[k] for k in FOLDED)
    if world % (tp * pp * cp):
        raise PlanError(f"rl_config.{resource_key}.num_npus={world} must be divisible by tensor x pipeline x "
                        f"context parallel = {tp} x {pp} x {cp}")
    asked_dp = world // (tp * pp * cp)
    if asked_dp % ep:
        raise PlanError(f"{section}.expert_model_parallel_size={ep} must divide the data parallel size "
                        f"{asked_dp} ({world} devices / (TP {tp} x PP {pp} x CP {cp}))")
    dp = world // tp
    if given_dp not in (None, dp):
        raise PlanError(f"generate_config.data_parallel_size={given_dp} disagrees with the layout's data "
                        f"parallel size {dp}; leave it unset (it is derived)")
    check_tp_divides_model(actor_config, tp, section)
    asked = note = ""
    if pp * cp * ep > 1:
        # not implemented as such: the same devices run FSDP over the folded ranks (same math: the
        # full model, full sequences and all experts are gathered per layer on every rank)
        parts = [f"TP={tp}"] + [f"{name}={v}" for name, v in (("PP", pp), ("CP", cp), ("EP", ep)) if v > 1]
        asked = " x ".join(parts + [f"DP={asked_dp}"])
        names = [n for n, v in (("pipeline", pp), ("context", cp), ("expert", ep)) if v > 1]
        extra = f"; num_layer_list={actor_config.num_layer_list} has no stages to size" \
            if actor_config.num_layer_list is not None else ""
        whose = "" if section == "actor_config" else f" of {section}"
        note = (f"layout{whose}: the config asks for {asked} on {world} devices; runs DP={dp} x TP={tp} with the "
                f"sharded engine (FSDP2 over {dp} DP ranks) on the same {world} devices, because "
                f"{' and '.join(names)} parallelism {'are' if len(names) > 1 else 'is'} not implemented; the training "
                f"math is the same{extra}")
        print(note, file=sys.stderr, flush=True)
    if actor_config.use_distributed_optimizer or asked:
        if dp == 1:
            where = "megatron_training" if section == "actor_config" else section
            raise PlanError(f"{where}.use_distributed_optimizer=true shards over data parallel ranks, "
                            f"but the layout has DP=1 ({world} devices / TP {tp}); set it to false")
        engine = "fsdp"
    else:
        engine = "tp" if tp > 1 else "ddp"
    custom = tuple(sorted((resource.get("custom_resources") or {}).items())) if isinstance(resource, dict) else ()
    return Layout(world_size=world, dp=dp, tp=tp, engine=engine, asked=asked, note=note, resources=custom)


def family_splits_attention(family: str) -> bool:
    """Whether the installed transformers' TP plan of ``family`` splits attention heads (models/sharding.py)."""
    from transformers import AutoConfig
    from mindspeed_rl.models.sharding import splits_attention
    return splits_attention(AutoConfig.for_model(family))


def check_tp_divides_model(cfg, tp, section="actor_config"):
    """TP must split evenly what the engine splits for the model's family (its HF ``base_model_tp_plan``,
    models/sharding.py; checked again on the model by the engine): the family's ``tp_sizes``
    (mindspeed_rl/families/). Routed experts are never split over TP (FSDP shards them over DP)."""
    from mindspeed_rl.config_cls.model_arch import has_model_section
    from mindspeed_rl.families import pick
    if tp <= 1 or not has_model_section(cfg):
        return
    for key, value in pick(cfg).tp_sizes(cfg, family_splits_attention):
        if value is not None and value % tp:
            raise PlanError(f"{section}.tensor_model_parallel_size={tp} does not divide the model's "
                            f"{key}={value}")


def check_update_dispatch(size, layout, actor_config, mini, rows, key="actor_update_dispatch_size"):
    """Upstream's actor_update_dispatch_size: the rows an actor rank fetches per update call,
    each call cut into mini-batches of mini_batch_size // DP (upstream 2f84bab's integrated
    worker ignores it). Here each optimizer step trains on one share of mini // DP rows, so a
    size that cuts upstream's mini-batches evenly, or is not used, runs the same math."""
    if size is None or size == mini // layout.dp:
        return
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise PlanError(f"rl_config.{key}={size!r} must be a positive int")
    world, tp = layout.world_size, layout.tp
    upstream_dp = world // (tp * actor_config.pipeline_model_parallel_size * actor_config.context_parallel_size)
    per_step, per_rank = mini // upstream_dp, rows // upstream_dp
    if per_step <= size < per_rank and size % per_step:
        raise PlanError(f"rl_config.{key}={size} is not a multiple of the rows a rank trains "
                        f"per optimizer step in the config's layout (mini_batch_size // DP = {per_step}): upstream "
                        f"would train on uneven mini-batches; give a multiple of {per_step} or leave it unset")
    warnings.warn(f"rl_config.{key}={size} only sizes upstream's update fetches: each "
                  f"optimizer step here trains on mini_batch_size // DP = {mini // layout.dp} rows per rank "
                  f"(DP={layout.dp}), the same mini-batches", UserWarning, stacklevel=3)
