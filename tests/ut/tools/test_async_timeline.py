"""The async runs' timeline: the logger's timeline.jsonl (cut at a resume like the other records) and the report
that reads it (busy fractions per lane, the picture, one line on bad input)."""
import json

import pytest

from mindspeed_rl.reports import async_timeline
from mindspeed_rl.reports.report_inputs import ReportError
from mindspeed_rl.utils.loggers import TIMELINE_FILE, MetricsLogger


def span(lane, start, end, what="batch 1"):
    return {"lane": lane, "start": start, "end": end, "what": what}


def write_run(folder):
    log = MetricsLogger(str(folder))
    log.log_timeline(1, [span("engine 0", 0.0, 4.0), span("engine 1", 0.0, 2.0), span("trainer", 0.0, 4.0, "wait"),
                         span("trainer", 4.0, 7.0, "train 1"), span("trainer", 7.0, 8.0, "sync v1")])
    log.log_timeline(2, [span("engine 0", 4.0, 8.0, "batch 2"), span("engine 0", 5.0, 6.0, "batch 2"),
                         span("engine 1", 4.0, 6.0, "batch 2"), span("trainer", 8.0, 10.0, "train 2")])
    log.log_timeline(3, [])  # nothing to write
    log.close()


def test_the_logger_writes_a_span_a_line_and_a_resume_cuts_later_ones(tmp_path):
    write_run(tmp_path)
    lines = [json.loads(x) for x in (tmp_path / TIMELINE_FILE).read_text().splitlines()]
    assert [x["iteration"] for x in lines] == [1] * 5 + [2] * 4
    assert lines[3] == {"iteration": 1, "lane": "trainer", "start": 4.0, "end": 7.0, "what": "train 1"}
    MetricsLogger(str(tmp_path), resume_from=1).log_timeline(2, [span("engine 0", 20.0, 21.0)])
    again = async_timeline.read_timeline(str(tmp_path))  # the resume marker is skipped
    assert [(s["iteration"], s["start"]) for s in again if s["iteration"] == 2] == [(2, 20.0)]
    assert len(again) == 6


def test_busy_fractions_count_overlaps_once_and_waits_as_idle(tmp_path):
    write_run(tmp_path)
    spans = async_timeline.read_timeline(str(tmp_path / TIMELINE_FILE))
    window, busy = async_timeline.busy_fractions(spans)
    assert window == 10.0
    assert list(busy) == ["trainer", "engine 0", "engine 1"]
    assert busy == {"trainer": pytest.approx(0.6), "engine 0": pytest.approx(0.8), "engine 1": pytest.approx(0.4)}
    table = async_timeline.format_table(async_timeline.pick(spans, (2, 2)))
    assert table.splitlines()[0] == "iterations 2-2: 6.000 s"
    assert "| engine 0 | 2 | 66.7% | 33.3% |" in table and "| trainer | 1 | 33.3% | 66.7% |" in table


def test_the_command_prints_the_table_and_draws_the_lanes(tmp_path, capsys):
    write_run(tmp_path)
    png = tmp_path / "t.png"
    assert async_timeline.main(["--run", str(tmp_path), "--png", str(png), "--iterations", "1-2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("iterations 1-2: 10.000 s") and png.stat().st_size > 1000


@pytest.mark.parametrize("content, message", [
    ("", "holds no spans"),
    ("{oops\n", "line 1: not valid JSON"),
    ('{"iteration": 1, "lane": "engine 0", "start": 1}\n', "line 1: missing end"),
    ('{"iteration": 1, "lane": "engine 0", "start": 2, "end": 1}\n', "line 1: ends (1) before it starts (2)"),
    ('{"iteration": 1, "lane": 3, "start": 1, "end": 2}\n', "line 1: lane must be a string"),
    ('{"iteration": 1, "lane": "t", "start": true, "end": 2}\n', "line 1: start and end must be numbers"),
])
def test_bad_timelines_are_one_line(tmp_path, capsys, content, message):
    (tmp_path / TIMELINE_FILE).write_text(content)
    assert async_timeline.main(["--run", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_run_without_a_timeline_and_iterations_it_lacks_are_named(tmp_path):
    with pytest.raises(ReportError, match="only the async trainer modes write a timeline"):
        async_timeline.read_timeline(str(tmp_path))
    write_run(tmp_path)
    with pytest.raises(ReportError, match=r"no spans in iterations 5-6 \(the timeline holds 1-2\)"):
        async_timeline.pick(async_timeline.read_timeline(str(tmp_path)), (5, 6))
    assert async_timeline.main(["--run", str(tmp_path), "--iterations", "3-2"]) == 2
