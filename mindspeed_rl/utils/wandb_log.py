"""rl_config.use_wandb: every iteration's metrics (the record metrics.jsonl gets) go to Weights & Biases too,
at step = iteration. wandb reads its own WANDB_* variables (WANDB_MODE=offline: files only, no network).

Upstream's keys: ``wandb_project`` (default ``mindspeed-rl``), ``wandb_exp_name`` (the run's name; default:
wandb's), ``wandb_save_dir`` (the folder wandb writes under; default: WANDB_DIR, else the run folder).
Each process is one wandb run. The first run of a run folder keeps its wandb id in ``<run folder>/wandb_run_id``;
a run resumed from iteration N is a new wandb run in the group of that id, with ``resumed_from_iteration: N`` in
its config, logging steps N+1 on (wandb keeps no step twice in one run, and rewinding a run is not generally
available), so the group's latest run holds the resumed history as metrics.jsonl does.
"""
import os
import secrets
from dataclasses import dataclass, field
from typing import Dict, Optional

INSTALL = "pip install -e '.[wandb]' from the repository root (or pip install 'wandb>=0.31.0,<0.32')"
ID_FILE = "wandb_run_id"
DEFAULT_PROJECT = "mindspeed-rl"


@dataclass(frozen=True)
class WandbSettings:
    project: str
    name: Optional[str]      # None: wandb names the run
    save_dir: Optional[str]  # None: WANDB_DIR, else the run folder
    config: Dict = field(default_factory=dict)  # the run's config, shown with the run


def check_wandb(rl_config) -> None:
    """rl_config.use_wandb needs the wandb package: one line naming the key and the install command."""
    if not rl_config.use_wandb:
        return
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise ValueError(f"rl_config.use_wandb: true needs the wandb package, which is not installed: {INSTALL}") \
            from None


def wandb_settings(rl_config, config: Optional[Dict] = None) -> Optional[WandbSettings]:
    """The run's wandb settings (None: rl_config.use_wandb is off)."""
    if not rl_config.use_wandb:
        return None
    check_wandb(rl_config)
    return WandbSettings(project=rl_config.wandb_project or DEFAULT_PROJECT, name=rl_config.wandb_exp_name or None,
                         save_dir=rl_config.wandb_save_dir or None, config=dict(config or {}))


def _previous_id(output_dir: Optional[str]) -> Optional[str]:
    path = os.path.join(output_dir, ID_FILE) if output_dir else None
    if not path or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return f.read().strip() or None


class WandbRun:
    """The wandb run of one process: a fresh run starts the run folder's group, a resumed one joins it."""

    def __init__(self, settings: WandbSettings, output_dir: Optional[str] = None, resume_from: Optional[int] = None):
        import wandb
        folder = settings.save_dir or os.environ.get("WANDB_DIR") or output_dir
        if folder:
            os.makedirs(folder, exist_ok=True)
        first = _previous_id(output_dir) if resume_from else None
        run_id = secrets.token_hex(4)
        self.group = first or run_id  # the group's name: its first run's id
        config = dict(settings.config, **({"resumed_from_iteration": resume_from} if resume_from else {}))
        try:
            self.run = wandb.init(project=settings.project, name=settings.name, dir=folder, config=config,
                                  id=run_id, group=self.group)
        except Exception as err:  # noqa: BLE001  (e.g. no API key, no network: one line naming the key)
            raise RuntimeError(f"rl_config.use_wandb: wandb could not start a run ({type(err).__name__}: "
                               f"{' '.join(str(err).split())}); WANDB_MODE=offline writes its files only") from None
        if output_dir and not first:
            tmp = os.path.join(output_dir, ID_FILE + ".tmp")
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(self.run.id + "\n")
            os.replace(tmp, os.path.join(output_dir, ID_FILE))

    def log(self, iteration: int, metrics: Dict[str, float]) -> None:
        self.run.log(dict(metrics), step=iteration)

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None
