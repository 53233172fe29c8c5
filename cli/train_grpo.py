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


def _resume(actor, world_size=None, critic_world_size=None):
    """The checkpoint of ours that ``load`` names (``checkpoint.open_resume``: every shard file, the
    trainer state, the fallback, and what the resume asks for), else None; before Ray starts."""
    from mindspeed_rl.utils.checkpoint import open_resume
    return open_resume(actor.load, actor.finetune, actor.no_load_optim, actor.no_load_rng, world_size,
                       critic_world_size)


def _check_save_folder(save: str) -> None:
    """``megatron_training.save`` must be a folder this process can write (made now if missing):
    found before any iteration runs rather than at the first save."""
    if not save:
        return
    try:
        os.makedirs(save, exist_ok=True)
        import tempfile
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=save)
        os.close(fd)
        os.remove(probe)
    except OSError as err:
        parent = save
        while parent and not os.path.exists(parent):
            parent = os.path.dirname(parent)
        why = (f"{parent!r} is a file, not a folder" if parent and os.path.isfile(parent)
               else f"{type(err).__name__}: {err.strerror or err}")
        raise ValueError(f"megatron_training.save={save!r} is not a writable folder: {why}") from None


def _built_with_warnings(config: str, overrides: List[str]):
    """``build_configs``; each config warning printed as one line ``warning: ...``."""
    import warnings

    from mindspeed_rl.plan.loader import build_configs, load_config
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfgs = build_configs(load_config(config, overrides))
    for w in caught:
        if issubclass(w.category, UserWarning):
            print(f"warning: {' '.join(str(w.message).split())}", flush=True)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return cfgs


def run(config: str, overrides: List[str] = (), output_dir: str = "outputs/grpo",
        tiny_model_dir: str = None) -> List[Dict[str, float]]:
    """Run training; returns the per-iteration metrics."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from mindspeed_rl.plan.algorithm_line import algorithm_change_line, algorithm_line, algorithm_record
    from mindspeed_rl.config_cls.model_arch import check_against_checkpoint, hf_config_kwargs
    from mindspeed_rl.plan.rollout_spec import check_model_len
    from mindspeed_rl.datasets.options import data_options
    from mindspeed_rl.datasets.prompt_dataset import prompt_batches
    from mindspeed_rl.models.tiny_model import build_tiny_checkpoint

    hf_logging.disable_progress_bar()
    overrides = list(overrides)
    if tiny_model_dir:
        overrides.append(f"megatron_training.model_path={os.path.abspath(tiny_model_dir)}")
    cfgs = _built_with_warnings(config, overrides)
    actor, rl, gen = cfgs.actor_config, cfgs.rl_config, cfgs.generate_config
    trainer_class(actor.stage)
    from mindspeed_rl.trainer.driver_stages import check_stage_functions
    check_stage_functions(cfgs.plan, worker_classes())  # every kept row has its function, before Ray starts
    if tiny_model_dir and not os.path.exists(os.path.join(tiny_model_dir, "config.json")):
        build_tiny_checkpoint(tiny_model_dir, seed=0, **hf_config_kwargs(actor))
    _check_model_folder(actor.model_path, tokenizer_path=actor.tokenizer_name_or_path)
    check_against_checkpoint(actor, actor.model_path)
    check_model_len(cfgs.plan.worker.rollout, actor, actor.model_path)  # the checkpoint's limit, now it exists
    tokenizer = AutoTokenizer.from_pretrained(actor.tokenizer_name_or_path or actor.model_path,
                                              trust_remote_code=gen.trust_remote_code)
    from mindspeed_rl.utils.checkpoint import FRESH_STATE
    critic = cfgs.plan.critic.layout.world_size if cfgs.plan.critic is not None else None
    resume = _resume(actor, cfgs.plan.layout.world_size, critic)
    state = resume.state if resume is not None else dict(FRESH_STATE)
    _check_save_folder(actor.save)
    from mindspeed_rl.utils.loggers import check_run_folder
    from mindspeed_rl.utils.run_lock import RunLocks
    # this run owns its run folder and save folder until it ends (a second run stops here, before Ray)
    with RunLocks([("--output-dir", output_dir), ("megatron_training.save", actor.save)]):
        check_run_folder(output_dir, state["iteration"])  # a fresh run never appends to another run's metrics
        data = prompt_batches(actor.data_path, actor.global_batch_size, rl.seed, tokenizer,
                              start=state["data_position"], **data_options(actor, rl))
        data = itertools.chain([next(data)], data)  # a bad data_path fails here, before Ray starts
        print(algorithm_line(cfgs.plan, actor.stage))
        if resume is not None and not resume.finetune:
            change = algorithm_change_line(state.get("algorithm"), algorithm_record(cfgs.plan, actor.stage),
                                           resume.folder, resume.iteration)
            if change:
                print(change, flush=True)
        for line in cfgs.plan.long_tail_lines():
            print(line)
        print(cfgs.plan.worker.rollout.describe())
        print(f"run plan: {cfgs.plan.summary()}")
        return _train(cfgs, tokenizer, data, resume, state, output_dir)


STAGES = (None, "ray_grpo", "ray_dapo", "ray_ppo")  # upstream's values of megatron_training.stage


def trainer_class(stage):
    """The trainer of ``megatron_training.stage``: one class runs every algorithm (the run plan says which rows
    run); the stage names upstream's trainer (unset: GRPO)."""
    from mindspeed_rl.trainer.stage_trainer import StageTableTrainer
    if stage not in STAGES:
        raise ValueError(f"megatron_training.stage={stage!r}: no such trainer; known: ray_grpo, ray_dapo, ray_ppo")
    return StageTableTrainer


# the worker class of each worker group (RunPlan.roles)
def worker_classes():
    from mindspeed_rl.workers.critic_worker import CriticWorker
    from mindspeed_rl.workers.integrated_worker import IntegratedWorker
    from mindspeed_rl.workers.rollout_engine import RolloutEngineWorker
    return {"actor": IntegratedWorker, "critic": CriticWorker, "rollout": RolloutEngineWorker}


def group_options(plan, role: str, groups) -> dict:
    """Where a group runs beside the others: the rollout engines of colocate_async share the actor ranks' devices
    (half a device each), those of separate_async get devices of their own."""
    spec = plan.asynchronous
    if spec is None or not spec.colocated:
        return {}
    if role == "rollout":
        return {"colocate_with": groups["actor"], "device_share": 0.5}
    return {"device_share": 0.5} if role == "actor" else {}


def make_reward(rl, tokenizer, eos_id: int):
    """The run's reward: rl_config's verifiers and weights, scored in a pool of verifier_parallel
    processes under verifier_timeout seconds a response."""
    from mindspeed_rl.rewards.rule_reward import VerifierReward
    return VerifierReward(rl.verifier_function, rl.verifier_weight, eos_id, tokenizer=tokenizer,
                          parallel=rl.verifier_parallel, timeout=rl.verifier_timeout)


def _train(cfgs, tokenizer, data, resume, state, output_dir):
    """Train from ``state`` (``resume.state``, read before Ray started, or a fresh run's)."""
    from mindspeed_rl.plan.algorithm_line import algorithm_record
    from mindspeed_rl.utils.checkpoint import Checkpointer
    from mindspeed_rl.utils.loggers import MetricsLogger
    from mindspeed_rl.utils.ray_utils import init_ray, shutdown_ray
    from mindspeed_rl.utils.wandb_log import wandb_settings
    from mindspeed_rl.workers.scheduler.launcher import RayActorGroup
    from mindspeed_rl.workers.scheduler.pinning import pin_groups

    actor, rl, plan = cfgs.actor_config, cfgs.rl_config, cfgs.plan
    eos_id = tokenizer.eos_token_id
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    os.makedirs(output_dir, exist_ok=True)
    start = state["iteration"]
    sections = {"megatron_training": actor.dict(), "rl_config": rl.dict(),
                "generate_config": cfgs.generate_config.dict()}
    # before Ray: a fresh run's sinks (wandb's start too) open here, a resumed run's once its checkpoint has loaded
    logger = MetricsLogger(output_dir, use_tensorboard=rl.use_tensorboard, resume_from=start,
                           checkpoint=resume.folder if resume else None, wandb=wandb_settings(rl, sections))
    started = init_ray(temp_dir=os.path.join(output_dir, "ray"))
    install_signal_handlers()  # again: ray.init puts its own SIGTERM handler in place
    groups, trainer = {}, None
    ok = False
    reward = make_reward(rl, tokenizer, eos_id)
    try:
        classes = worker_classes()
        weights = {"actor": actor.model_path, "critic": cfgs.critic_config.model_path if cfgs.critic_config else None,
                   "rollout": actor.model_path}
        for role in plan.roles:  # one worker group per role, each on its own devices and layout
            groups[role] = RayActorGroup(classes[role], plan.for_group(role), **group_options(plan, role, groups))
            groups[role].initialize(weights[role], eos_id, pad_id)
        pinned = pin_groups(groups, plan)
        if pinned:
            print("pinned cores: " + "; ".join(f"{role} {cores}" for role, cores in pinned.items()), flush=True)
        group = groups["actor"]
        if resume is not None:
            def load_workers(*args):
                for role in resume.groups:  # a finetune's group without state in the checkpoint starts afresh
                    groups[role].load_checkpoint(*args)
            state = Checkpointer(actor.load, load_workers=load_workers).restore(resume)
        logger.start()  # a resumed run's records are cut and marked only once its checkpoint loaded
        extra_keys = ["labels"] + [k for k in actor.dataset_additional_keys if k != "labels"]
        trainer = trainer_class(actor.stage)(
            actor_worker=group, critic_worker=groups.get("critic"), rollout_worker=groups.get("rollout"),
            reward_list=[reward],
            run_plan=plan, logger=logger, save_interval=actor.save_interval if actor.save else 0,
            save_dir=actor.save, kl_ctrl_type=rl.kl_ctrl_type,
            kl_horizon=rl.kl_horizon, kl_target=rl.kl_target, init_kl_coef=rl.init_kl_coef,
            dataset_additional_keys=extra_keys, max_prompt_length=rl.max_prompt_length,
            save_optimizer=not actor.no_save_optim, save_rng=not actor.no_save_rng,
            max_nonfinite_iterations=rl.max_nonfinite_iterations,
            max_failed_reward_iterations=rl.max_failed_reward_iterations, eos_id=eos_id,
            max_all_rejected_iterations=rl.max_all_rejected_iterations,
            run_identity={"data_path": actor.data_path, "tokenizer": tokenizer},
            algorithm=algorithm_record(plan, actor.stage))
        trainer.load_state_dict(state)  # the checkpoint's driver state, or a fresh run's
        if resume is not None and not resume.finetune:
            trainer.load_driver_state(resume.folder)
        history = trainer.fit(data, start_iteration=state["iteration"])
        if actor.save:
            export = os.path.join(actor.save, "hf")
            group.export_hf(export)
            tokenizer.save_pretrained(export)
            print(f"exported HF weights and tokenizer to {export}")
        ok = True
        return history
    finally:
        if trainer is not None and trainer.last_saved is not None:
            PROGRESS["last_saved"], PROGRESS["save_dir"] = trainer.last_saved, actor.save
        try:
            logger.close()
            reward.close()
            for g in reversed(list(groups.values())):  # colocated engines end before the group they share
                # after an error or a signal the workers may be stuck: end them instead of asking them
                g.shutdown() if ok else g.kill()
        finally:
            if started:
                shutdown_ray()


DRY_RUN_MODEL_KEYS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                      "kv_channels", "padded_vocab_size", "vocab_size", "max_position_embeddings", "rotary_base",
                      "untie_embeddings_and_output_weights", "add_qkv_bias")


def dry_run(config: str, overrides: List[str] = ()) -> List[str]:
    """The lines ``--dry-run`` prints: config notes, model section, run plan and per-rank
    memory of ``config``. Starts no Ray, reads no weights or data."""
    import warnings

    from mindspeed_rl.plan.algorithm_line import algorithm_line
    from mindspeed_rl.plan.loader import build_configs, load_config
    from mindspeed_rl.config_cls.megatron_config import MODEL_FAMILY_KEYS
    from mindspeed_rl.reports.memory_plan import plan_memory, table

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_config(config, list(overrides))
        cfgs = build_configs(cfg)
    actor, plan = cfgs.actor_config, cfgs.plan
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
    lines.append(algorithm_line(plan, actor.stage))
    lines += plan.long_tail_lines()
    lines.append(plan.worker.rollout.describe())
    lines.append(f"run plan: {plan.summary()}")
    lines.append(f"optimizer steps: {plan.steps_per_iteration} per iteration x {plan.train_iters} iterations; "
                 f"mini-batch {plan.mini_batch_rows} rows of {plan.rows_per_round} per round")
    for role in plan.roles:
        lines.append(table("memory plan" + ("" if role == "actor" else f" ({role})"), cfgs, plan_memory(cfgs, role),
                           [64.0, 80.0, 141.0], role))
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
    parser = argparse.ArgumentParser(description="GRPO, DAPO or PPO post-training (megatron_training.stage: "
                                                 "ray_grpo, ray_dapo, ray_ppo) with DP batch balance on Ray, "
                                                 "from an upstream-style YAML config.")
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


class Interrupted(BaseException):
    """SIGINT / SIGTERM / SIGHUP: unwinds the run (Ray torn down in ``_train``) like KeyboardInterrupt."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


PROGRESS: Dict[str, object] = {}  # the last checkpoint of this run, for the closing line
_SIGNALLED: List[int] = []


def _on_signal(signum, frame):
    if _SIGNALLED:  # a second signal while the run unwinds: let the tear-down finish
        return
    _SIGNALLED.append(signum)
    raise Interrupted(signum)


def install_signal_handlers() -> None:
    import signal
    import threading
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGHUP: the terminal closed
            signal.signal(sig, _on_signal)


EXIT_INPUT, EXIT_RUNTIME = 2, 1
INPUT_ERRORS = (ValueError, TypeError, FileNotFoundError, KeyError, OSError)


def one_line(err: BaseException) -> str:
    """An error as one line: Ray's wrapped errors as the remote error itself or the actor that died."""
    import ray
    from mindspeed_rl.workers.scheduler.launcher import brief
    text = brief(err) if isinstance(err, ray.exceptions.RayError) else str(err) or type(err).__name__
    return " ".join(text.split())


def _checkpoint_note() -> str:
    if PROGRESS.get("last_saved") is not None:
        return f"; the last checkpoint is iteration {PROGRESS['last_saved']} in {PROGRESS['save_dir']}"
    return ""


def main(argv=None) -> int:
    args = _parser().parse_intermixed_args(argv)  # overrides may come before or after options
    debug = args.debug or os.environ.get("MSRL_DEBUG") == "1"
    if args.dry_run:
        return _dry_run_main(args, debug)
    import signal
    PROGRESS.clear()
    _SIGNALLED.clear()
    install_signal_handlers()
    try:
        history = run(args.config, args.overrides, args.output_dir, args.tiny_model_dir)
    except Interrupted as stop:
        name = signal.Signals(stop.signum).name
        print(f"error: stopped by {name}; Ray was shut down{_checkpoint_note()}", file=sys.stderr, flush=True)
        return 128 + stop.signum
    except Exception as err:  # noqa: BLE001  (every error ends in one line; --debug shows the traceback)
        if debug:
            raise
        import ray
        runtime = isinstance(err, (RuntimeError, TimeoutError, ray.exceptions.RayError)) or \
            not isinstance(err, INPUT_ERRORS)
        print(f"error: {one_line(err)}{_checkpoint_note() if runtime else ''}", file=sys.stderr, flush=True)
        return EXIT_RUNTIME if runtime else EXIT_INPUT
    if not history:
        print("done: no iteration left to run (train_iters is not above the resumed iteration)")
        return 0
    first, last = history[0], history[-1]
    print(f"done: {len(history)} iterations, reward {first.get('reward/mean', 0):.3f} -> "
          f"{last.get('reward/mean', 0):.3f}; metrics in {os.path.join(args.output_dir, 'metrics.jsonl')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
