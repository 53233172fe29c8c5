"""Read an upstream-style GRPO YAML file and turn it into config objects.

File layout::

    defaults:
      - model: [qwen25_7b]        # or: - model: qwen25_7b
    megatron_training: {...}      # shared by every worker role
    actor_config: {...}           # actor-only overrides
    rl_config: {...}
    generate_config: {...}
    profiler_config: {...}        # any other section is kept as a raw dict

Each model name is read from ``<name>.yaml`` in ``<config_dir>/model``,
``<config_dir>/../model`` or the repository's ``configs/model`` (first hit),
and collected into a ``model`` section ``{name: {...}}``.
"""
import difflib
import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from mindspeed_rl.config_cls.base_config import check_type
from mindspeed_rl.config_cls.generate_config import GenerateConfig
from mindspeed_rl.config_cls.key_types import unset_types
from mindspeed_rl.plan.idle_keys import idle_key_lines
from mindspeed_rl.plan.learning_signal import zero_advantage_reasons
from mindspeed_rl.config_cls.megatron_config import MegatronConfig
from mindspeed_rl.config_cls.model_arch import check_fixed
from mindspeed_rl.config_cls.rl_config import RLConfig
from mindspeed_rl.plan.rollout_spec import check_model_len
from mindspeed_rl.plan.run_plan import RunPlan, build_run_plan
from mindspeed_rl.config_cls.unimplemented import check_keys
from mindspeed_rl.plan.validate import check_rl_args, write_derived
from mindspeed_rl.utils.checkpoint import CheckpointError, load_kind, resolve
from mindspeed_rl.utils.megatron_format import megatron_load_error
from mindspeed_rl.utils.wandb_log import check_wandb

REPO_MODEL_DIR = Path(__file__).resolve().parents[2] / "configs" / "model"
ROLE_SECTIONS = ("megatron_training", "actor_config", "ref_config", "reward_config", "critic_config")
KNOWN_SECTIONS = ("megatron_training", "actor_config", "ref_config", "reward_config", "critic_config",
                  "rl_config", "generate_config", "model")
# upstream sections that load but are not carried out (a warning when not empty)
IGNORED_SECTIONS = {"profiler_config": "no profiling is done", "msprobe_config": "no msprobe dumps are written"}


class ConfigError(ValueError):
    """A config file or override is malformed."""


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads '5e-7' (no dot) as a float, as YAML 1.2 does."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def parse_yaml(text, source="<string>"):
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as err:
        raise ConfigError(f"invalid YAML in {source}: {err}") from err


def _read_yaml(path):
    return parse_yaml(Path(path).read_text(encoding="utf-8"), source=str(path))


def _default_model_names(defaults, source):
    """Model names listed under ``defaults``."""
    if defaults is None:
        return []
    if not isinstance(defaults, list):
        raise ConfigError(f"'defaults' in {source} must be a list")
    names = []
    for entry in defaults:
        if not isinstance(entry, Mapping) or set(entry) != {"model"}:
            raise ConfigError(f"unsupported 'defaults' entry {entry!r} in {source}; "
                              f"expected '- model: <name or list of names>'")
        value = entry["model"]
        names.extend(value if isinstance(value, list) else [value])
    for name in names:
        if not isinstance(name, str):
            raise ConfigError(f"model name {name!r} in 'defaults' of {source} is not a string")
    return names


def _model_search_dirs(config_dir):
    return [config_dir / "model", config_dir.parent / "model", REPO_MODEL_DIR]


def _load_model_file(name, config_dir):
    tried = []
    for folder in _model_search_dirs(config_dir):
        candidate = folder / f"{name}.yaml"
        tried.append(str(candidate))
        if candidate.is_file():
            data = _read_yaml(candidate)
            if not isinstance(data, Mapping) or not isinstance(data.get(name), Mapping):
                raise ConfigError(f"model file {candidate} must map '{name}' to a dict of settings")
            return dict(data[name])
    raise FileNotFoundError(f"model file for '{name}' not found; searched: {', '.join(tried)}")


def _check_sections(cfg, source):
    """Unknown top-level sections are errors (a typo would drop a whole section)."""
    known = KNOWN_SECTIONS + tuple(IGNORED_SECTIONS)
    for section in cfg:
        if section not in known:
            close = [k for k in known if k.startswith(str(section))] or difflib.get_close_matches(section, known, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"unknown section '{section}' in {source}{hint}; known sections: {', '.join(known)}")


def _warn_ignored_sections(cfg):
    for section, instead in IGNORED_SECTIONS.items():
        if cfg.get(section):
            warnings.warn(f"section '{section}' is not implemented: {instead}", UserWarning, stacklevel=3)


def _apply_override(cfg, item):
    if not isinstance(item, str) or "=" not in item:
        raise ConfigError(f"override {item!r} must look like 'section.key=value'")
    dotted, raw = item.split("=", 1)
    parts = [p.strip() for p in dotted.strip().split(".")]
    if len(parts) < 2 or not all(parts):
        raise ConfigError(f"override {item!r} must name a section and a key: 'section.key=value'")
    node = cfg
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ConfigError(f"override {item!r}: '{part}' is not a mapping")
        node = child
    node[parts[-1]] = parse_yaml(raw, source=f"override {item!r}")


def load_config(path, overrides=None):
    """Return the config file at ``path`` as a dict of sections.

    ``overrides`` is a list of ``section.key=value`` strings (value parsed as
    YAML; deeper paths such as ``generate_config.sampling_config.top_k=5``
    work too). They are applied before model files are resolved, so
    ``model.<name>.<key>=...`` changes a model setting.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    raw = _read_yaml(path)
    if not isinstance(raw, Mapping):
        raise ConfigError(f"top level of {path} must be a mapping of sections")

    cfg = {}
    for section, body in raw.items():
        if section == "defaults":
            continue
        if body is None:
            body = {}
        if not isinstance(body, Mapping):
            raise ConfigError(f"section '{section}' in {path} must be a mapping, "
                              f"got {type(body).__name__}")
        cfg[section] = dict(body)
    _check_sections(cfg, f"{path}")
    for item in overrides or []:
        _apply_override(cfg, item)
        _check_sections(cfg, f"override {item!r}")

    inline = cfg.pop("model", {})
    if not isinstance(inline, Mapping):
        raise ConfigError(f"section 'model' in {path} must be a mapping")
    wanted = _default_model_names(raw.get("defaults"), path)
    # Names referenced by sections but defined neither in defaults nor inline.
    for role in ROLE_SECTIONS:
        name = cfg.get(role, {}).get("model")
        if isinstance(name, str) and name not in wanted and name not in inline:
            wanted.append(name)

    models = {}
    for name in wanted:
        models[name] = _load_model_file(name, path.parent)
    for name, body in inline.items():
        if not isinstance(body, Mapping):
            raise ConfigError(f"model '{name}' in {path} must be a mapping")
        models[name] = {**models.get(name, {}), **body}
    cfg["model"] = models
    return cfg


@dataclass
class RunConfigs:
    """Config objects of one run, as built by ``build_configs``."""
    actor_config: MegatronConfig
    ref_config: MegatronConfig
    reward_config: MegatronConfig
    rl_config: RLConfig
    generate_config: GenerateConfig
    plan: RunPlan = None  # the one layout of the run
    critic_config: MegatronConfig = None  # PPO (stage ray_ppo): megatron_training + critic_config
    extra: dict = field(default_factory=dict)  # other sections, raw


def build_configs(cfg):
    """Build and validate the config objects from a ``load_config`` result.

    In integrated mode (the default) the reference and reward roles reuse the
    actor's MegatronConfig and must not have their own sections.
    """
    def section(name):
        body = cfg.get(name) or {}
        if not isinstance(body, Mapping):
            raise ConfigError(f"section '{name}' must be a mapping")
        return body

    models = section("model")
    training = section("megatron_training")
    _check_section_keys(cfg)
    check_section_types(cfg)
    rl_config = RLConfig(section("rl_config"))
    actor_config = MegatronConfig({**training, **section("actor_config")}, models)
    if rl_config.use_integrated_worker:
        for name in ("ref_config", "reward_config"):
            if name in cfg:
                raise ConfigError(f"section '{name}' must not be set when "
                                  f"rl_config.use_integrated_worker is true")
        ref_config = reward_config = actor_config
    else:
        ref_config = MegatronConfig({**training, **section("ref_config")}, models)
        reward_config = MegatronConfig({**training, **section("reward_config")}, models)
    generate_config = GenerateConfig(section("generate_config"))
    critic_config = None
    if actor_config.stage == "ray_ppo":
        critic_config = MegatronConfig({**training, **section("critic_config")}, models)
    elif cfg.get("critic_config"):
        raise ConfigError(f"section 'critic_config' is read by PPO only (megatron_training.stage=ray_ppo); "
                          f"stage is {actor_config.stage!r}")

    _warn_ignored_sections(cfg)
    check_keys(actor_config, rl_config, generate_config, error_cls=ConfigError)
    roles = [c for c in {id(c): c for c in (actor_config, ref_config, reward_config, critic_config)}.values()
             if c is not None]
    for role in roles:
        _upstream_semantics(role, rl_config)
    check_fixed(actor_config, error_cls=ConfigError)
    if critic_config is not None:
        _check_critic_folders(critic_config, actor_config)
    _weights_from_load(actor_config)
    if critic_config is not None:
        _critic_weights(critic_config, actor_config)
    _check_verifiers(rl_config)
    for reason in zero_advantage_reasons(rl_config):
        warnings.warn(f"nothing can be learned: {reason}", UserWarning, stacklevel=2)
    check_rl_args(actor_config, rl_config, generate_config)
    check_wandb(rl_config)
    plan = build_run_plan(actor_config, rl_config, generate_config, critic_config)
    check_model_len(plan.worker.rollout, actor_config, actor_config.model_path)
    write_derived(plan, rl_config, generate_config)
    for line in idle_key_lines(rl_config, plan):
        warnings.warn(line, UserWarning, stacklevel=2)
    for role in roles:
        role.max_prompt_length = rl_config.max_prompt_length

    extra = {k: v for k, v in cfg.items() if k not in KNOWN_SECTIONS}
    return RunConfigs(actor_config, ref_config, reward_config, rl_config, generate_config, plan=plan,
                      critic_config=critic_config, extra=extra)


def _check_critic_folders(critic, actor):
    """The critic's state is saved in the actor's checkpoint folders, so ``critic_config.save`` /
    ``load`` may only repeat the actor's (upstream's PPO config gives the same folder to both)."""
    for key in ("save", "load"):
        value = getattr(critic, key)
        if value is not None and value != getattr(actor, key):
            raise ConfigError(f"critic_config.{key}={value!r} differs from the actor's {getattr(actor, key)!r}: the "
                              f"critic is saved in and loaded from the actor's checkpoint folders; leave it unset "
                              f"or give the same folder")


def _critic_weights(critic, actor):
    """The critic starts from HF weights of the same family (a value head is added on load): its own
    ``model_path`` when its section gives one, else the actor's weights."""
    critic.save, critic.load = actor.save, actor.load
    if critic.model_path is None or critic.model_path == critic.tokenizer_name_or_path:
        critic.model_path = actor.model_path


def _weights_from_load(cfg):
    """``load`` names a checkpoint of ours (resume; with ``finetune: true`` its
    weights only, from iteration 0) or, for a weights-only load (``finetune``, or
    ``no_load_optim`` and ``no_load_rng`` as upstream's configs give), HF weights to
    start from. A Megatron-format folder is an error naming the key to use instead.
    A weights-only ``load`` that does not exist loads nothing, as in Megatron; the
    weights are then ``model_path``, else upstream's ``tokenizer_name_or_path``
    (the HF folder upstream converts from). Checked here, before anything starts."""
    if cfg.load is not None:
        message = megatron_load_error("megatron_training.load", cfg.load, cfg.tokenizer_name_or_path)
        if message:
            raise ConfigError(message)
        if load_kind(cfg.load, cfg.finetune, cfg.no_load_optim, cfg.no_load_rng) != "hf":
            try:
                resolve(cfg.load)
            except CheckpointError as err:
                raise ConfigError(f"megatron_training.load: {err}") from err
        elif os.path.isdir(cfg.load):
            if cfg.model_path not in (None, cfg.load):
                raise ConfigError(f"megatron_training.load={cfg.load!r} (weights only) and "
                                  f"model_path={cfg.model_path!r} name different weights; set one of them")
            cfg.model_path = cfg.load
        else:
            start = cfg.model_path or cfg.tokenizer_name_or_path
            if start is None:
                raise ConfigError(f"megatron_training.load={cfg.load!r} does not exist and no other weights are "
                                  f"given: set megatron_training.model_path to an HF weights folder")
            warnings.warn(f"megatron_training.load={cfg.load!r} does not exist: nothing is loaded from it (as "
                          f"Megatron does); training starts from the HF weights at {start!r}",
                          UserWarning, stacklevel=3)
            cfg.load = None
    if cfg.model_path is None and cfg.tokenizer_name_or_path:
        cfg.model_path = cfg.tokenizer_name_or_path  # upstream: the HF folder the weights were converted from


def _int_list(key, value):
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    try:
        return [int(str(v).strip()) for v in items if str(v).strip()]
    except ValueError:
        raise ConfigError(f"megatron_training.{key}={value!r} must be comma-separated integers") from None


def _upstream_semantics(cfg, rl_config):
    """Upstream keys whose meaning is carried out by rewriting other settings."""
    # a mini-batch larger than the batch is the whole batch (upstream's split gives one part)
    total = cfg.global_batch_size * rl_config.n_samples_per_prompt if cfg.global_batch_size else None
    if total and rl_config.mini_batch_size > total:
        rl_config.mini_batch_size = total
    if cfg.use_rotary_position_embeddings:  # Megatron's older switch
        cfg.position_embedding_type = "rope"
    pp = cfg.pipeline_model_parallel_size
    if cfg.num_layer_list is not None:
        counts = _int_list("num_layer_list", cfg.num_layer_list)
        if len(counts) != pp or (cfg.num_layers is not None and sum(counts) != cfg.num_layers):
            raise ConfigError(f"megatron_training.num_layer_list={cfg.num_layer_list!r} must give "
                              f"pipeline_model_parallel_size={pp} stage sizes adding up to "
                              f"num_layers={cfg.num_layers}")
    if cfg.noop_layers is not None and cfg.num_layers is not None:
        noop = sorted(set(_int_list("noop_layers", cfg.noop_layers)))
        if any(i < 0 or i >= cfg.num_layers for i in noop):
            raise ConfigError(f"megatron_training.noop_layers={cfg.noop_layers!r} must index layers "
                              f"0..{cfg.num_layers - 1}")
        # identity layers that only pad pipeline stages; the model has the others
        cfg.num_layers -= len(noop)
        cfg.noop_layers = None


def _check_verifiers(rl_config):
    """Verifier names are checked now (rewards/rule_reward.text_verifier_path), not in a worker later."""
    from mindspeed_rl.rewards.rule_reward import text_verifier_path
    for name in rl_config.verifier_function:
        if not isinstance(name, str):
            raise ConfigError(f"rl_config.verifier_function: {name!r} is not a verifier name")
        try:
            text_verifier_path(name)
        except ValueError as err:
            raise ConfigError(f"rl_config.verifier_function: {err}") from None


def _section_keys():
    from mindspeed_rl.config_cls.generate_config import SAMPLING_DEFAULTS
    training = set(MegatronConfig()._declared_defaults()) | {"model"}
    keys = {name: training for name in ROLE_SECTIONS}
    keys["rl_config"] = set(RLConfig()._declared_defaults())
    keys["generate_config"] = set(GenerateConfig()._declared_defaults())
    keys["generate_config.sampling_config"] = set(SAMPLING_DEFAULTS)
    return keys, training - {"model"}


def _unknown(where, key, allowed):
    close = difflib.get_close_matches(str(key), sorted(allowed), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return ConfigError(f"{where}: unknown key '{key}'{hint}")


def _check_section_keys(cfg):
    """Every key of every section must be declared; a typo names its section."""
    keys, model_keys = _section_keys()
    for name, allowed in keys.items():
        section, _, sub = name.partition(".")
        body = cfg.get(section)
        if sub and isinstance(body, Mapping):
            body = body.get(sub)
        if not isinstance(body, Mapping):
            continue
        for key in body:
            if str(key).replace("-", "_") not in allowed:
                raise _unknown(name, key, allowed)
    for model, body in (cfg.get("model") or {}).items():
        for key in body or {}:
            if str(key).replace("-", "_") not in model_keys:
                raise _unknown(f"model {model}", key, model_keys)


def check_section_types(cfg):
    """Every value of every section (and model) has its key's type, checked before any value is
    compared or used: one rule for all sections (base_config.check_type), errors name ``section.key``."""
    from mindspeed_rl.config_cls.generate_config import SAMPLING_DEFAULTS
    classes = {**dict.fromkeys(ROLE_SECTIONS, MegatronConfig), "rl_config": RLConfig,
               "generate_config": GenerateConfig}
    defaults = {cls: cls()._declared_defaults() for cls in set(classes.values())}
    bodies = [(name, cls, cfg.get(name)) for name, cls in classes.items()]
    bodies += [(f"model.{model}", MegatronConfig, body) for model, body in (cfg.get("model") or {}).items()]
    for where, cls, body in bodies:
        if not isinstance(body, Mapping):
            continue
        for key, value in body.items():
            name = str(key).replace("-", "_")
            if name == "model" or name not in defaults[cls]:
                continue
            if cls is GenerateConfig and name == "sampling_config" and isinstance(value, Mapping):
                for sub, sub_value in value.items():
                    sub = str(sub).replace("-", "_")
                    if sub in SAMPLING_DEFAULTS:
                        check_type(where, f"{name}.{sub}", SAMPLING_DEFAULTS[sub], sub_value,
                                   unset_types(cls.__name__, f"{name}.{sub}"))
                continue
            check_type(where, name, defaults[cls][name], value, unset_types(cls.__name__, name))
