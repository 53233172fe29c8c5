"""Train with GRPO on Ray from an upstream-style YAML config.

    python cli/train_grpo.py --config configs/grpo_tiny_cpu.yaml [--tiny-model-dir DIR]
        [--output-dir DIR] [section.key=value ...]

``megatron_training.model_path`` is a local HF checkpoint directory (a real
Qwen2 model on GPU/NPU); ``--tiny-model-dir`` builds a tiny random one there
first (CPU runs, tests). ``megatron_training.data_path`` is ``toy:<task>``
(see mindspeed_rl/datasets/toy_tasks.py) or a JSONL file of prompts.
"""
import argparse
import os
import sys
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ray  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from mindspeed_rl.config_cls.loader import build_configs, load_config  # noqa: E402
from mindspeed_rl.config_cls.model_arch import check_against_checkpoint, hf_config_kwargs  # noqa: E402
from mindspeed_rl.datasets.prompt_dataset import prompt_batches  # noqa: E402
from mindspeed_rl.models.rule_reward import RuleReward  # noqa: E402
from mindspeed_rl.models.tiny_model import build_tiny_checkpoint  # noqa: E402
from mindspeed_rl.trainer.grpo_trainer_hybrid import RayGRPOTrainer  # noqa: E402
from mindspeed_rl.utils.checkpoint import is_checkpoint, read_state, resolve  # noqa: E402
from mindspeed_rl.utils.loggers import MetricsLogger  # noqa: E402
from mindspeed_rl.utils.ray_utils import init_ray  # noqa: E402
from mindspeed_rl.workers.integrated_worker import IntegratedWorker  # noqa: E402
from mindspeed_rl.workers.scheduler.launcher import RayActorGroup  # noqa: E402


def _quiet_hf():
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()


def run(config: str, overrides: List[str] = (), output_dir: str = "outputs/grpo",
        tiny_model_dir: str = None) -> List[Dict[str, float]]:
    """Run training; returns the per-iteration metrics."""
    overrides = list(overrides)
    _quiet_hf()
    if tiny_model_dir:
        overrides.append(f"megatron_training.model_path={os.path.abspath(tiny_model_dir)}")
    cfgs = build_configs(load_config(config, overrides))
    actor, rl, gen, plan = cfgs.actor_config, cfgs.rl_config, cfgs.generate_config, cfgs.plan
    if tiny_model_dir and not os.path.exists(os.path.join(tiny_model_dir, "config.json")):
        build_tiny_checkpoint(tiny_model_dir, seed=0, **hf_config_kwargs(actor))
    if not actor.model_path or not os.path.isdir(actor.model_path):
        raise ValueError(f"megatron_training.model_path must be a local checkpoint directory, got {actor.model_path!r}")
    check_against_checkpoint(actor, actor.model_path)
    tokenizer = AutoTokenizer.from_pretrained(actor.tokenizer_name_or_path or actor.model_path,
                                              trust_remote_code=gen.trust_remote_code)
    eos_id = tokenizer.eos_token_id
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    print(f"run plan: {plan.summary()}")
    os.makedirs(output_dir, exist_ok=True)
    started = init_ray(temp_dir=os.path.join(output_dir, "ray"))
    group = None
    logger = MetricsLogger(output_dir, use_tensorboard=rl.use_tensorboard)
    try:
        group = RayActorGroup(IntegratedWorker, actor, rl, gen, plan)
        group.initialize(actor.model_path, eos_id, pad_id)
        start, kl_coef = _load_checkpoint(group, actor)
        extra_keys = ["labels"] + [k for k in actor.dataset_additional_keys if k != "labels"]
        trainer = RayGRPOTrainer(
            actor_worker=group, reward_list=[RuleReward(rl.verifier_function, rl.verifier_weight, eos_id)],
            run_plan=plan, logger=logger, save_interval=actor.save_interval if actor.save else 0,
            save_dir=actor.save, adv_estimator=rl.adv_estimator, kl_ctrl_type=rl.kl_ctrl_type,
            kl_horizon=rl.kl_horizon, kl_target=rl.kl_target, init_kl_coef=rl.init_kl_coef,
            dataset_additional_keys=extra_keys, max_prompt_length=rl.max_prompt_length,
            save_optimizer=not actor.no_save_optim, save_rng=not actor.no_save_rng)
        data = prompt_batches(actor.data_path, actor.global_batch_size, rl.seed, tokenizer, start=start)
        history = trainer.fit(data, start_iteration=start, kl_coef=kl_coef)
        if actor.save:
            export = os.path.join(actor.save, "hf")
            group.export_hf(export)
            tokenizer.save_pretrained(export)
            print(f"exported HF weights and tokenizer to {export}")
        return history
    finally:
        logger.close()
        if group is not None:
            group.shutdown()
        if started:
            ray.shutdown()


def _load_checkpoint(group, actor):
    """Resume from ``load`` (iteration, KL coefficient) or, with finetune, take
    its weights only; returns (start iteration, KL coefficient or None)."""
    if not actor.load or not is_checkpoint(actor.load):
        return 0, None
    folder, iteration = resolve(actor.load)
    if actor.finetune:  # weights only, from iteration 0 (as Megatron's --finetune)
        group.load_checkpoint(folder, 0, False, False)
        print(f"loaded weights of {folder} (finetune: iteration 0)")
        return 0, None
    group.load_checkpoint(folder, iteration, not actor.no_load_optim, not actor.no_load_rng)
    print(f"resumed from {folder} at iteration {iteration}")
    return iteration, read_state(folder)["kl_coef"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--output-dir", default="outputs/grpo")
    parser.add_argument("--tiny-model-dir", default=None)
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    args = parser.parse_args(argv)
    history = run(args.config, args.overrides, args.output_dir, args.tiny_model_dir)
    first, last = history[0], history[-1]
    print(f"done: {len(history)} iterations, reward {first.get('reward/mean', 0):.3f} -> "
          f"{last.get('reward/mean', 0):.3f}; metrics in {os.path.join(args.output_dir, 'metrics.jsonl')}")


if __name__ == "__main__":
    main()
