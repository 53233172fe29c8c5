"""Details of the metrics files and of the console logger: line numbers of a bad record, the resume
marker's fields and message, file modes, truncation of a record-less file, closing twice, and the
``Loggers`` lines (level, prefix, UTC time, last rank only)."""
import json
import logging
import os
import subprocess
import sys
from datetime import datetime, timezone

import pytest

from mindspeed_rl.utils import loggers
from mindspeed_rl.utils.loggers import Loggers, MetricsLogger, _Records, check_run_folder, read_records

PLAN = {"consumer": "actor_train", "loads": [1.0, 2.0]}


def _write_lines(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _run(folder, iterations, **kw):
    logger = MetricsLogger(str(folder), **kw)
    for it in iterations:
        logger.log_balance(it, [PLAN])
        logger.log(it, {"reward/mean": float(it)}, f"iter {it}")
    logger.close()


class _FixedNow(datetime):
    """``datetime.now``: 03:04:05 UTC, which the machine's clock shows as 12:04:05 local time."""

    @classmethod
    def now(cls, tz=None):
        utc = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
        return utc.astimezone(tz) if tz is not None else datetime(2026, 1, 2, 12, 4, 5)


@pytest.fixture
def fixed_now(monkeypatch):
    monkeypatch.setattr(loggers, "datetime", _FixedNow)


# read_records


def test_a_bad_line_is_named_by_its_one_based_number(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"iteration": 1}\n{"iteration": 2\n')
    with pytest.raises(ValueError) as err:
        read_records(str(path))
    assert str(err.value) == f"{path} line 2: not valid JSON (Expecting ',' delimiter)"


def test_records_are_read_as_utf8_whatever_the_locale(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes('{"iteration": 1, "note": "caf\u00e9 \u2713"}\n'.encode("utf-8"))
    assert read_records(str(path)) == [{"iteration": 1, "note": "caf\u00e9 \u2713"}]
    # an ASCII locale (C, without Python's UTF-8 coercion) reads it the same
    env = dict(os.environ, LC_ALL="C", LANG="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0")
    code = ("import sys; from mindspeed_rl.utils.loggers import read_records; "
            "print(ascii(read_records(sys.argv[1])))")
    out = subprocess.run([sys.executable, "-c", code, str(path)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ascii([{"iteration": 1, "note": "caf\u00e9 \u2713"}])


# check_run_folder


def test_a_folder_with_records_and_a_resume_marker_is_another_runs(tmp_path):
    _write_lines(tmp_path / "metrics.jsonl", [{"iteration": 3}, {"event": "resume", "from_iteration": 3},
                                              {"iteration": 4}])
    with pytest.raises(ValueError, match="iterations 3-4"):
        check_run_folder(str(tmp_path))


# the files of a fresh and of a resumed run


def test_a_fresh_run_empties_a_file_that_holds_no_iteration(tmp_path):
    # a run that stopped right after its resume marker left no iteration: the folder is free, and a fresh
    # run starts its files over
    _write_lines(tmp_path / "metrics.jsonl", [{"event": "resume", "from_iteration": 2, "checkpoint": "c"}])
    _write_lines(tmp_path / "balance.jsonl", [{"event": "resume", "from_iteration": 2, "checkpoint": "c"}])
    _run(tmp_path, [1])
    assert read_records(str(tmp_path / "metrics.jsonl")) == [{"iteration": 1, "reward/mean": 1.0}]
    assert read_records(str(tmp_path / "balance.jsonl")) == [{"iteration": 1, **PLAN}]


def test_record_files_are_created_rw_r_r(tmp_path):
    old = os.umask(0)
    try:
        _run(tmp_path, [1])
    finally:
        os.umask(old)
    for name in ("metrics.jsonl", "balance.jsonl"):
        assert os.stat(tmp_path / name).st_mode & 0o777 == 0o644


def test_several_plans_are_written_as_separate_lines(tmp_path):
    logger = MetricsLogger(str(tmp_path))
    plans = [dict(PLAN, consumer=c) for c in ("actor_train", "ref", "critic")]
    logger.log_balance(7, plans)
    logger.close()
    lines = (tmp_path / "balance.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"iteration": 7, **p} for p in plans]


def test_closing_twice_closes_the_descriptor_once(tmp_path):
    records = _Records(str(tmp_path / "x.jsonl"), fresh=True)
    fd = records.fd
    records.close()
    assert records.fd is None
    with pytest.raises(OSError):
        os.fstat(fd)
    records.close()  # nothing left to close
    assert records.fd is None


def test_resume_drops_a_range_and_names_its_ends(tmp_path, capsys, fixed_now):
    _run(tmp_path, [1, 2, 3, 4, 5])
    capsys.readouterr()
    logger = MetricsLogger(str(tmp_path), resume_from=2, checkpoint="ckpt/iter_2")
    logger.start()
    logger.close()
    out = capsys.readouterr().out
    path = os.path.join(str(tmp_path), "metrics.jsonl")
    assert f"{path}: dropped the records of iterations 3-5 (after the resume point 2)\n" in out
    marker = read_records(path)[-1]
    assert marker == {"event": "resume", "from_iteration": 2, "checkpoint": "ckpt/iter_2",
                      "dropped_iterations": [3, 4, 5], "time": "2026-01-02T03:04:05+00:00"}


def test_a_stale_temp_file_of_a_cut_is_replaced(tmp_path):
    # a run killed while cutting its file left the temporary copy; the next cut overwrites and moves it
    _run(tmp_path, [1, 2, 3])
    for name in ("metrics.jsonl", "balance.jsonl"):
        (tmp_path / (name + ".tmp")).write_text("garbage\n")
    logger = MetricsLogger(str(tmp_path), resume_from=1)
    logger.start()
    logger.close()
    assert sorted(os.listdir(tmp_path)) == ["balance.jsonl", "metrics.jsonl"]
    assert [r.get("iteration") for r in read_records(str(tmp_path / "metrics.jsonl"))] == [1, None]


def test_tensorboard_is_off_unless_asked(tmp_path):
    logger = MetricsLogger(str(tmp_path))
    logger.log(1, {"a": 1.0}, "iter 1")
    logger.close()
    assert logger.tensorboard is None
    assert sorted(os.listdir(tmp_path)) == ["balance.jsonl", "metrics.jsonl"]


def test_without_tensorboard_the_run_says_so_and_goes_on(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    logger = MetricsLogger(str(tmp_path), use_tensorboard=True)
    logger.log(1, {"a": 1.0}, "iter 1")
    logger.close()
    assert capsys.readouterr().out == ("tensorboard is not installed (pip install tensorboard); metrics go to "
                                       "stdout and JSONL only\niter 1\n")
    assert logger.tensorboard is None
    assert read_records(str(tmp_path / "metrics.jsonl")) == [{"iteration": 1, "a": 1.0}]


def test_log_prints_its_line(tmp_path, capsys):
    logger = MetricsLogger()
    logger.log(3, {"a": 1.0}, "iteration 3 | a 1.0")
    logger.close()
    assert capsys.readouterr().out == "iteration 3 | a 1.0\n"


# Loggers


def _fresh(name, level=logging.DEBUG):
    logger = logging.getLogger(name)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    return Loggers(name, level)


def test_the_default_name_is_the_root_logger():
    root = logging.getLogger()
    handlers, level, propagate = list(root.handlers), root.level, root.propagate
    try:
        assert Loggers().logger is root
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        root.propagate = propagate


def test_a_named_logger_gets_one_console_handler_and_stays_out_of_the_root(capsys):
    log = _fresh("msrl_test_loggers_named")
    assert log.logger is logging.getLogger("msrl_test_loggers_named")
    assert len(log.logger.handlers) == 1 and isinstance(log.logger.handlers[0], logging.StreamHandler)
    Loggers("msrl_test_loggers_named")
    assert len(log.logger.handlers) == 1  # a second Loggers adds no second handler
    assert log.logger.propagate is False
    seen = []

    class Catch(logging.Handler):
        def emit(self, record):
            seen.append(record)
    catch = Catch()
    logging.getLogger().addHandler(catch)
    try:
        log.warning("only on the console")
    finally:
        logging.getLogger().removeHandler(catch)
    assert seen == []


@pytest.mark.parametrize("method, level", [("debug", "DEBUG"), ("info", "INFO"), ("warning", "WARNING"),
                                           ("error", "ERROR")])
def test_each_level_writes_a_formatted_line(method, level, capsys, fixed_now):
    log = _fresh(f"msrl_test_loggers_{method}")
    getattr(log, method)("plain message")
    getattr(log, method)({"reward/mean": 0.5, "actor/lr": 1e-6}, iteration=3, steps=10)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    for line in err:
        stamp, rest = line.split(" - ", 1)
        datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f")
        assert rest.startswith(f"{level} - ")
    assert err[0].endswith(f" - {level} - [2026-01-02 03:04:05] {level} plain message")
    assert err[1].endswith(f" - {level} - [2026-01-02 03:04:05] iteration: 3 / 10 | reward/mean : 0.5000 | "
                           "actor/lr : 1.0000e-06")


def test_handle_msg_prefixes_only_with_both_iteration_and_steps(fixed_now):
    assert Loggers.handle_msg("m", "INFO", iteration=3) == "[2026-01-02 03:04:05] INFO m"
    assert Loggers.handle_msg("m", "INFO", steps=10) == "[2026-01-02 03:04:05] INFO m"
    assert Loggers.handle_msg("m", "INFO", 3, 10) == "[2026-01-02 03:04:05] iteration: 3 / 10 | m"
    assert Loggers.handle_msg(42, "INFO", 3, 10) == "[2026-01-02 03:04:05] iteration: 3 / 10 | 42"


def test_handle_msg_time_is_utc_to_the_second():
    msg = Loggers.handle_msg("m", "INFO")
    stamp = msg[1:msg.index("]")]
    parsed = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S")
    assert msg == f"[{stamp}] INFO m" and parsed.year >= 2024


@pytest.mark.parametrize("rank, logs", [(0, False), (1, False), (2, False), (3, True)])
def test_info_under_torch_distributed_only_from_the_last_rank(rank, logs, monkeypatch, capsys, fixed_now):
    import torch.distributed as dist
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda *a, **k: rank)
    monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: 4)
    log = _fresh("msrl_test_loggers_ranks")
    log.info("hello")
    err = capsys.readouterr().err
    if logs:
        assert err.endswith(" - INFO - [2026-01-02 03:04:05] INFO hello\n")
    else:
        assert err == ""
