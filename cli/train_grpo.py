"""Train with GRPO on Ray from an upstream-style YAML config.

    python cli/train_grpo.py --config configs/grpo_tiny_cpu.yaml [--tiny-model-dir DIR]
        [--output-dir DIR] [--debug] [section.key=value ...]

``megatron_training.model_path`` is a local HF checkpoint directory (a real
Qwen2 model on GPU/NPU); ``--tiny-model-dir`` builds a tiny random one there
first (CPU runs, tests). ``megatron_training.data_path`` is ``toy:<task>``
(see mindspeed_rl/datasets/toy_tasks.py) or a JSONL file of prompts.
Config, model and data problems are found before Ray starts and printed as
one line ``error: ...`` (exit 2); ``--debug`` or ``MSRL_DEBUG=1`` shows the traceback.
"""
import argparse
import itertools
import os
import sys
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def _check_model_folder(path: str, tiny_model_dir: str = None, tokenizer_path: str = None):
    """The model folder must hold a config, and the tokenizer folder (``tokenizer_name_or_path``,
    else the model folder) a tokenizer; name the key and what is missing."""
    if not path:
        raise ValueError("megatron_training.model_path is not set: give a local HF checkpoint folder, "
                         "or --tiny-model-dir DIR to build a tiny random model there")
    if not os.path.isdir(path):
        raise ValueError(f"megatron_training.model_path={path!r} is not a folder")
    if tokenizer_path and not os.path.isdir(tokenizer_path):
        raise ValueError(f"megatron_training.tokenizer_name_or_path={tokenizer_path!r} is not a folder "
                         f"(a local tokenizer folder is needed: runs download nothing)")
    has_tokenizer = lambda folder: any(os.path.isfile(os.path.join(folder, f)) for f in TOKENIZER_FILES)  # noqa: E731
    if tokenizer_path and not has_tokenizer(tokenizer_path):
        raise ValueError(f"megatron_training.tokenizer_name_or_path={tokenizer_path!r} holds no tokenizer "
                         f"(one of {', '.join(TOKENIZER_FILES)})")
    missing = [] if os.path.isfile(os.path.join(path, "config.json")) else ["config.json"]
    if not tokenizer_path and not has_tokenizer(path):
        missing.append(f"a tokenizer (one of {', '.join(TOKENIZER_FILES)}; or set "
                       f"megatron_training.tokenizer_name_or_path)")
    if missing:
        raise ValueError(f"model folder {path!r} lacks {' and '.join(missing)}")


def _checkpoint(actor):
    """(iteration folder, iteration) when ``load`` names a checkpoint of ours, else None."""
    from mindspeed_rl.utils.checkpoint import is_checkpoint, resolve
    return resolve(actor.load) if actor.load and is_checkpoint(actor.load) else None


def run(config: str, overrides: List[str] = (), output_dir: str = "outputs/grpo",
        tiny_model_dir: str = None) -> List[Dict[str, float]]:
    """Run training; returns the per-iteration metrics."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from mindspeed_rl.config_cls.loader import build_configs, load_config
    from mindspeed_rl.config_cls.model_arch import check_against_checkpoint, hf_config_kwargs
    from mindspeed_rl.datasets.options import data_options
    from mindspeed_rl.datasets.prompt_dataset import prompt_batches
    from mindspeed_rl.models.tiny_model import build_tiny_checkpoint

    hf_logging.disable_progress_bar()
    overrides = list(overrides)
    if tiny_model_dir:
        overrides.append(f"megatron_training.model_path={os.path.abspath(tiny_model_dir)}")
    cfgs = build_configs(load_config(config, overrides))
    actor, rl, gen = cfgs.actor_config, cfgs.rl_config, cfgs.generate_config
    if tiny_model_dir and not os.path.exists(os.path.join(tiny_model_dir, "config.json")):
        build_tiny_checkpoint(tiny_model_dir, seed=0, **hf_config_kwargs(actor))
    _check_model_folder(actor.model_path, tokenizer_path=actor.tokenizer_name_or_path)
    check_against_checkpoint(actor, actor.model_path)
    tokenizer = AutoTokenizer.from_pretrained(actor.tokenizer_name_or_path or actor.model_path,
                                              trust_remote_code=gen.trust_remote_code)
    checkpoint = _checkpoint(actor)
    start = checkpoint[1] if checkpoint and not actor.finetune else 0
    from mindspeed_rl.utils.loggers import check_run_folder
    check_run_folder(output_dir, start)  # a fresh run never appends to another run's metrics
    data = prompt_batches(actor.data_path, actor.global_batch_size, rl.seed, tokenizer, start=start,
                          **data_options(actor, rl))
    data = itertools.chain([next(data)], data)  # a bad data_path fails here, before Ray starts
    print(f"run plan: {cfgs.plan.summary()}")
    return _train(cfgs, tokenizer, data, checkpoint, start, output_dir)


def _train(cfgs, tokenizer, data, checkpoint, start, output_dir):
    from mindspeed_rl.models.rule_reward import RuleReward
    from mindspeed_rl.trainer.grpo_trainer_hybrid import RayGRPOTrainer
    from mindspeed_rl.utils.loggers import MetricsLogger
    from mindspeed_rl.utils.ray_utils import init_ray, shutdown_ray
    from mindspeed_rl.workers.integrated_worker import IntegratedWorker
    from mindspeed_rl.workers.scheduler.launcher import RayActorGroup

    actor, rl, gen, plan = cfgs.actor_config, cfgs.rl_config, cfgs.generate_config, cfgs.plan
    eos_id = tokenizer.eos_token_id
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    os.makedirs(output_dir, exist_ok=True)
    started = init_ray(temp_dir=os.path.join(output_dir, "ray"))
    group = None
    logger = MetricsLogger(output_dir, use_tensorboard=rl.use_tensorboard, resume_from=start,
                           checkpoint=checkpoint[0] if checkpoint else None)
    reward = RuleReward(rl.verifier_function, rl.verifier_weight, eos_id, tokenizer=tokenizer,
                        parallel=rl.verifier_parallel, timeout=rl.verifier_timeout)
    try:
        group = RayActorGroup(IntegratedWorker, actor, rl, gen, plan)
        group.initialize(actor.model_path, eos_id, pad_id)
        kl_coef = _load_checkpoint(group, actor, checkpoint, start)
        extra_keys = ["labels"] + [k for k in actor.dataset_additional_keys if k != "labels"]
        trainer = RayGRPOTrainer(
            actor_worker=group, reward_list=[reward],
            run_plan=plan, logger=logger, save_interval=actor.save_interval if actor.save else 0,
            save_dir=actor.save, adv_estimator=rl.adv_estimator, kl_ctrl_type=rl.kl_ctrl_type,
            kl_horizon=rl.kl_horizon, kl_target=rl.kl_target, init_kl_coef=rl.init_kl_coef,
            dataset_additional_keys=extra_keys, max_prompt_length=rl.max_prompt_length,
            save_optimizer=not actor.no_save_optim, save_rng=not actor.no_save_rng)
        history = trainer.fit(data, start_iteration=start, kl_coef=kl_coef)
        if actor.save:
            export = os.path.join(actor.save, "hf")
            group.export_hf(export)
            tokenizer.save_pretrained(export)
            print(f"exported HF weights and tokenizer to {export}")
        return history
    finally:
        logger.close()
        reward.close()
        if group is not None:
            group.shutdown()
        if started:
            shutdown_ray()


def _load_checkpoint(group, actor, checkpoint, start: int):
    """Resume from ``checkpoint`` (its KL coefficient is returned) or, with
    finetune, take its weights only (None)."""
    from mindspeed_rl.utils.checkpoint import read_state
    if checkpoint is None:
        return None
    folder, _ = checkpoint
    if actor.finetune:  # weights only, from iteration 0 (as Megatron's --finetune)
        group.load_checkpoint(folder, 0, False, False)
        print(f"loaded weights of {folder} (finetune: iteration 0)")
        return None
    group.load_checkpoint(folder, start, not actor.no_load_optim, not actor.no_load_rng)
    print(f"resumed from {folder} at iteration {start}")
    return read_state(folder)["kl_coef"]


DRY_RUN_MODEL_KEYS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                      "kv_channels", "padded_vocab_size", "vocab_size", "max_position_embeddings", "rotary_base",
                      "untie_embeddings_and_output_weights", "add_qkv_bias")


def dry_run(config: str, overrides: List[str] = ()) -> List[str]:
    """The lines ``--dry-run`` prints: config notes, model section, run plan and per-rank
    memory of ``config``. Starts no Ray, reads no weights or data."""
    import warnings

    from mindspeed_rl.config_cls.loader import build_configs, load_config
    from mindspeed_rl.config_cls.megatron_config import MODEL_FAMILY_KEYS
    from mindspeed_rl.tools.memory_plan import plan_memory, table

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_config(config, list(overrides))
        cfgs = build_configs(cfg)
    actor, rl, plan = cfgs.actor_config, cfgs.rl_config, cfgs.plan
    lines = [f"config: {config}" + (f" with {len(overrides)} override(s)" if overrides else "")]
    lines += [f"note: {' '.join(str(w.message).split())}" for w in caught]
    defaults = type(actor)()._declared_defaults()
    arch = [f"{k}={getattr(actor, k)}" for k in DRY_RUN_MODEL_KEYS if getattr(actor, k) is not None]
    arch += [f"{k}={getattr(actor, k)}" for k in MODEL_FAMILY_KEYS if getattr(actor, k) != defaults[k]]
    lines.append(f"model: {', '.join(sorted(cfg.get('model') or {})) or '(no model section)'}: " + " ".join(arch))
    lines.append(f"weights: model_path={actor.model_path}" + (f", load={actor.load}" if actor.load else ""))
    if plan.layout.asked:
        lines.append(f"layout asked: {plan.layout.asked}; runs: DP={plan.layout.dp} x TP={plan.layout.tp} "
                     f"({plan.layout.engine} engine)")
    lines.append(f"run plan: {plan.summary()}")
    lines.append(f"optimizer steps: {plan.steps_per_iteration} per iteration x {plan.train_iters} iterations; "
                 f"mini-batch {plan.mini_batch_rows} rows of {plan.rows_per_round} per round")
    lines.append(table("memory plan", cfgs, plan_memory(cfgs), [64.0, 80.0, 141.0]))
    return lines


def _dry_run_main(args, debug: bool) -> int:
    try:
        lines = dry_run(args.config, args.overrides)
    except (ValueError, TypeError, FileNotFoundError, KeyError, OSError) as err:
        if debug:
            raise
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    print("dry run: config, run plan and memory plan are fine; nothing was started")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="GRPO training with DP batch balance on Ray, from an "
                                                 "upstream-style YAML config.")
    parser.add_argument("--config", required=True, help="YAML config, e.g. configs/grpo_tiny_cpu.yaml")
    parser.add_argument("--output-dir", default="outputs/grpo",
                        help="run folder: metrics.jsonl, balance.jsonl, TensorBoard, Ray session files "
                             "(default: %(default)s). A fresh run stops if the folder holds another run's "
                             "metrics; a resumed run drops the records after its checkpoint and marks the resume")
    parser.add_argument("--tiny-model-dir", default=None,
                        help="build a tiny random model of the config's model section here (if not there "
                             "yet) and train it; sets megatron_training.model_path")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    parser.add_argument("--dry-run", action="store_true",
                        help="check the config only: print its notes, model section, run plan and per-rank "
                             "memory, then exit (no Ray, no weights, no data)")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value",
                        help="config overrides, value parsed as YAML (e.g. megatron_training.train_iters=8)")
    return parser


def main(argv=None) -> int:
    args = _parser().parse_intermixed_args(argv)  # overrides may come before or after options
    debug = args.debug or os.environ.get("MSRL_DEBUG") == "1"
    if args.dry_run:
        return _dry_run_main(args, debug)
    try:
        history = run(args.config, args.overrides, args.output_dir, args.tiny_model_dir)
    except (ValueError, TypeError, FileNotFoundError, KeyError, OSError, RuntimeError, TimeoutError) as err:
        if debug:
            raise
        text = " ".join(str(err).split())
        print(f"error: {text}", file=sys.stderr)
        return 1 if isinstance(err, (RuntimeError, TimeoutError)) else 2
    if not history:
        print("done: no iteration left to run (train_iters is not above the resumed iteration)")
        return 0
    first, last = history[0], history[-1]
    print(f"done: {len(history)} iterations, reward {first.get('reward/mean', 0):.3f} -> "
          f"{last.get('reward/mean', 0):.3f}; metrics in {os.path.join(args.output_dir, 'metrics.jsonl')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
