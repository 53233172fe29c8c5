"""MetricsLogger: a fresh run never appends to another run's records; a resumed run marks the resume
and keeps each iteration once."""
import json

import pytest

from mindspeed_rl.utils.loggers import MetricsLogger, check_run_folder, read_records


def _run(folder, iterations, **kw):
    logger = MetricsLogger(str(folder), **kw)
    for it in iterations:
        logger.log_balance(it, [{"consumer": "actor_train", "loads": [1.0, 2.0], "random_loads": [2.0, 1.0]}])
        logger.log(it, {"reward/mean": 0.1 * it}, f"iter {it}")
    logger.close()


def _iterations(path):
    return [r.get("iteration") for r in read_records(str(path))]


def test_fresh_run_into_a_folder_with_another_runs_metrics_stops(tmp_path, capsys):
    _run(tmp_path, [1, 2])
    with pytest.raises(ValueError) as err:
        MetricsLogger(str(tmp_path))
    message = str(err.value)
    assert str(tmp_path) in message and "metrics.jsonl" in message and "iterations 1-2" in message
    assert "\n" not in message
    assert _iterations(tmp_path / "metrics.jsonl") == [1, 2]  # nothing was touched
    # a folder whose files hold no iteration (a run that stopped before its first) is free
    (tmp_path / "metrics.jsonl").write_text("")
    (tmp_path / "balance.jsonl").write_text("")
    check_run_folder(str(tmp_path))
    _run(tmp_path, [1])
    assert _iterations(tmp_path / "metrics.jsonl") == [1]


def test_resume_marks_the_file_and_does_not_duplicate_iterations(tmp_path, capsys):
    _run(tmp_path, [1, 2, 3, 4, 5, 6])
    # resumed from the checkpoint of iteration 4: 5 and 6 are run again
    _run(tmp_path, [5, 6], resume_from=4, checkpoint="ckpt/iter_0000004")
    assert "dropped the records of iterations 5-6" in capsys.readouterr().out
    for name in ("metrics.jsonl", "balance.jsonl"):
        records = read_records(str(tmp_path / name))
        assert [r.get("iteration") for r in records] == [1, 2, 3, 4, None, 5, 6]
        marker = records[4]
        assert marker["event"] == "resume" and marker["from_iteration"] == 4
        assert marker["checkpoint"] == "ckpt/iter_0000004" and marker["dropped_iterations"] == [5, 6]
    # a second resume from an older checkpoint drops the later records and the later marker
    _run(tmp_path, [3], resume_from=2)
    records = read_records(str(tmp_path / "metrics.jsonl"))
    assert [r.get("iteration") for r in records] == [1, 2, None, 3]
    assert records[2]["from_iteration"] == 2 and records[2]["dropped_iterations"] == [3, 4, 5, 6]
    assert records[3]["reward/mean"] == pytest.approx(0.3)


def test_resume_into_a_new_folder_starts_with_the_marker(tmp_path):
    _run(tmp_path / "b", [3], resume_from=2, checkpoint="c")
    first = json.loads((tmp_path / "b" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["event"] == "resume" and "iteration" not in first


def test_output_dir_that_is_a_file_is_named(tmp_path):
    f = tmp_path / "out"
    f.write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        check_run_folder(str(f))


def test_tensorboard_events_follow_the_resume(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _run(tmp_path, [1, 2, 3, 4], use_tensorboard=True)
    logger = MetricsLogger(str(tmp_path), use_tensorboard=True, resume_from=2)
    for it in (3, 4):
        logger.log(it, {"reward/mean": 1.0 + it}, f"iter {it}")
    logger.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scalars = [(e.step, e.value) for e in events.Scalars("train/reward/mean")]
    assert scalars == [(1, pytest.approx(0.1)), (2, pytest.approx(0.2)), (3, 4.0), (4, 5.0)]


def test_tensorboard_is_a_requirement():
    # README: both install commands (tests/run_tests.sh, pip install -e .) bring TensorBoard
    import os
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    names = [line.split("#")[0].strip() for line in open(os.path.join(root, "requirements.txt"))]
    assert any(n.startswith("tensorboard") for n in names)


def test_resumed_logger_touches_nothing_until_its_checkpoint_loaded(tmp_path, capsys):
    _run(tmp_path, [1, 2, 3])
    before = {n: (tmp_path / n).read_text() for n in ("metrics.jsonl", "balance.jsonl")}
    logger = MetricsLogger(str(tmp_path), resume_from=1, checkpoint="ckpt/iter_0000001")
    logger.close()  # the load failed: no marker, no dropped records
    assert {n: (tmp_path / n).read_text() for n in before} == before
    logger = MetricsLogger(str(tmp_path), resume_from=1, checkpoint="ckpt/iter_0000001")
    logger.start()  # the load succeeded
    logger.close()
    assert _iterations(tmp_path / "metrics.jsonl") == [1, None]
    assert "dropped the records of iterations 2-3" in capsys.readouterr().out


def test_one_dropped_iteration_is_named_alone(tmp_path, capsys):
    _run(tmp_path, [1, 2, 3])
    _run(tmp_path, [3], resume_from=2, checkpoint="ckpt/iter_0000002")
    out = capsys.readouterr().out
    assert "dropped the records of iteration 3 (after the resume point 2)" in out and "3-3" not in out
