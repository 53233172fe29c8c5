"""rl_config.use_wandb: MetricsLogger sends every iteration's record to wandb at step = iteration (a stand-in
wandb pins the calls; wandb itself, offline, writes them to its run files), a resumed run joins the run
folder's group, and a run without wandb installed stops in one line naming the key and the install command."""
import json
import sys
import types
from types import SimpleNamespace

import pytest

from mindspeed_rl.config_cls.rl_config import RLConfig
from mindspeed_rl.utils.loggers import MetricsLogger, read_records
from mindspeed_rl.utils.wandb_log import ID_FILE, INSTALL, WandbSettings, check_wandb, wandb_settings
from wandb_records import offline_env, offline_runs


class StandInWandb:
    def __init__(self):
        self.inits, self.logged, self.finished = [], [], 0

    def init(self, **kwargs):
        self.inits.append(kwargs)
        run = SimpleNamespace(id=kwargs["id"], log=lambda data, step: self.logged.append((kwargs["id"], step, data)),
                              finish=self._finish)
        return run

    def _finish(self):
        self.finished += 1


@pytest.fixture
def fake_wandb(monkeypatch):
    fake = StandInWandb()
    module = types.ModuleType("wandb")
    module.init = fake.init
    monkeypatch.setitem(sys.modules, "wandb", module)
    monkeypatch.delenv("WANDB_DIR", raising=False)
    return fake


def _log(folder, iterations, settings, resume_from=None):
    logger = MetricsLogger(str(folder), resume_from=resume_from, wandb=settings)
    logger.start()
    for it in iterations:
        logger.log(it, {"reward/mean": 0.5 * it, "actor/pg_loss": -1.0 * it}, f"iter {it}")
    logger.close()


def test_settings_come_from_upstreams_keys_with_defaults():
    assert wandb_settings(RLConfig({})) is None  # use_wandb off: no wandb
    on = wandb_settings(RLConfig({"use_wandb": True}), {"rl_config": {"seed": 1}})
    assert on == WandbSettings(project="mindspeed-rl", name=None, save_dir=None, config={"rl_config": {"seed": 1}})
    named = wandb_settings(RLConfig({"use_wandb": True, "wandb_project": "p", "wandb_exp_name": "e",
                                     "wandb_save_dir": "/w"}))
    assert (named.project, named.name, named.save_dir) == ("p", "e", "/w")


def test_every_record_goes_to_wandb_at_its_iteration_and_the_run_is_finished(tmp_path, fake_wandb):
    settings = WandbSettings("p", "e", None, {"rl_config": {"seed": 3}})
    _log(tmp_path, [1, 2, 3], settings)
    (init,) = fake_wandb.inits
    run_id = init["id"]
    assert init == dict(project="p", name="e", dir=str(tmp_path), config={"rl_config": {"seed": 3}}, id=run_id,
                        group=run_id)
    records = [r for r in read_records(str(tmp_path / "metrics.jsonl"))]
    assert fake_wandb.logged == [(run_id, r["iteration"], {k: v for k, v in r.items() if k != "iteration"})
                                 for r in records]
    assert len(records) == 3 and fake_wandb.finished == 1
    assert (tmp_path / ID_FILE).read_text() == run_id + "\n"


def test_a_resumed_run_is_a_new_wandb_run_in_the_first_runs_group(tmp_path, fake_wandb):
    settings = WandbSettings("p", None, None, {})
    _log(tmp_path, [1, 2, 3, 4], settings)
    first = fake_wandb.inits[0]["id"]
    _log(tmp_path, [3, 4], settings, resume_from=2)
    resumed = fake_wandb.inits[1]
    assert resumed["id"] != first and resumed["group"] == first
    assert resumed["config"] == {"resumed_from_iteration": 2}
    assert [(i, s) for i, s, _ in fake_wandb.logged] == [(first, 1), (first, 2), (first, 3), (first, 4),
                                                        (resumed["id"], 3), (resumed["id"], 4)]
    assert (tmp_path / ID_FILE).read_text() == first + "\n"  # the group keeps its first run's id
    # a fresh run in a new folder starts a group of its own
    _log(tmp_path / "other", [1], settings)
    assert fake_wandb.inits[2]["group"] == fake_wandb.inits[2]["id"] != first


def test_the_save_dir_key_then_wandb_dir_then_the_run_folder(tmp_path, fake_wandb, monkeypatch):
    _log(tmp_path / "a", [1], WandbSettings("p", None, str(tmp_path / "w"), {}))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "env"))
    _log(tmp_path / "b", [1], WandbSettings("p", None, None, {}))
    assert [i["dir"] for i in fake_wandb.inits] == [str(tmp_path / "w"), str(tmp_path / "env")]
    assert (tmp_path / "w").is_dir() and (tmp_path / "env").is_dir()


def test_a_run_wandb_cannot_start_is_one_line_naming_the_key_and_offline_mode(tmp_path, fake_wandb, monkeypatch):
    def refuse(**kwargs):
        raise ValueError("api_key not configured\n(no-tty)")
    monkeypatch.setattr(sys.modules["wandb"], "init", refuse)
    with pytest.raises(RuntimeError) as info:
        MetricsLogger(str(tmp_path), wandb=WandbSettings("p", None, None, {}))
    assert str(info.value) == ("rl_config.use_wandb: wandb could not start a run (ValueError: api_key not configured "
                               "(no-tty)); WANDB_MODE=offline writes its files only")
    assert not (tmp_path / ID_FILE).exists()


def test_use_wandb_without_wandb_installed_is_one_line_naming_the_key(monkeypatch):
    check_wandb(RLConfig({"use_wandb": True}))  # installed here (the test extra)
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed: import wandb fails
    check_wandb(RLConfig({}))  # off: not needed
    with pytest.raises(ValueError) as info:
        check_wandb(RLConfig({"use_wandb": True}))
    assert str(info.value) == f"rl_config.use_wandb: true needs the wandb package, which is not installed: {INSTALL}"
    assert INSTALL.startswith("pip install -e '.[wandb]'")


def test_offline_wandb_writes_each_iterations_metrics_to_its_run_files(tmp_path, monkeypatch):
    offline_env(monkeypatch, tmp_path)
    settings = WandbSettings("proj", "exp", None, {"rl_config": {"seed": 5}})
    _log(tmp_path, [1, 2, 3], settings)
    _log(tmp_path, [3], settings, resume_from=2)
    first, resumed = offline_runs(str(tmp_path))
    records = {r["iteration"]: {k: v for k, v in r.items() if k != "iteration"}
               for r in read_records(str(tmp_path / "metrics.jsonl")) if "iteration" in r}
    assert first["history"] == {1: records[1], 2: records[2], 3: {"reward/mean": 1.5, "actor/pg_loss": -3.0}}
    assert resumed["history"] == {3: records[3]}
    assert (first["project"], first["name"], first["config"]) == ("proj", "exp", {"rl_config": {"seed": 5}})
    assert first["group"] == first["run_id"] == (tmp_path / ID_FILE).read_text().strip()
    assert resumed["group"] == first["run_id"] != resumed["run_id"]
    assert resumed["config"]["resumed_from_iteration"] == 2
    json.dumps(first)  # plain values


def test_a_fresh_run_never_joins_a_group_left_in_its_folder_and_a_resume_without_one_starts_its_own(
        tmp_path, fake_wandb):
    from mindspeed_rl.utils.wandb_log import WandbRun
    (tmp_path / ID_FILE).write_text("left0000\n")  # e.g. a run that stopped before its first record
    fresh = WandbRun(WandbSettings("p", None, None, {}), str(tmp_path))
    assert fake_wandb.inits[-1]["group"] == fresh.run.id != "left0000"
    assert (tmp_path / ID_FILE).read_text() == fresh.run.id + "\n"  # the folder's group is now this run's
    lone = WandbRun(WandbSettings("p", None, None, {}), str(tmp_path / "empty"), resume_from=3)
    assert fake_wandb.inits[-1]["group"] == lone.run.id  # no id file: a group of its own
    WandbRun(WandbSettings("p", None, None, {}), None, resume_from=3)  # no run folder at all
    assert fake_wandb.inits[-1]["group"] == fake_wandb.inits[-1]["id"] and fake_wandb.inits[-1]["dir"] is None
    fresh.close()
    fresh.close()  # a second close does nothing
    assert fake_wandb.finished == 1
