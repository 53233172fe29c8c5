"""Edges of the driver's death-notice filter: a raylet record without lines, a Ray without the printer, and
a second call that keeps the one wrapper."""
import pytest
import ray._private.worker as ray_worker

from mindspeed_rl.utils import ray_notices

NOTICE = ray_notices.DEATH_NOTICE + ". Worker ID: ab"


@pytest.fixture
def printer(monkeypatch):
    monkeypatch.delenv("MSRL_DEBUG", raising=False)
    printed = []

    def original(data, ignore_prefix):
        printed.append((data["pid"], list(data["lines"]), ignore_prefix))
    monkeypatch.setattr(ray_worker, "print_to_stdstream", original)
    return printed


def test_a_raylet_record_without_lines_is_kept_with_no_lines():
    data = {"pid": "raylet", "is_err": False}
    assert ray_notices._without_death_notices(data) == {"pid": "raylet", "is_err": False, "lines": []}
    assert data == {"pid": "raylet", "is_err": False}  # the record itself is not changed


def test_a_raylet_record_without_lines_prints_nothing(printer):
    assert ray_notices.drop_worker_death_notices()
    ray_worker.print_to_stdstream({"pid": "raylet", "is_err": False}, ignore_prefix=False)
    assert printer == []


def test_a_ray_without_the_printer_is_left_alone(monkeypatch):
    monkeypatch.delenv("MSRL_DEBUG", raising=False)
    monkeypatch.delattr(ray_worker, "print_to_stdstream")
    assert ray_notices.drop_worker_death_notices() is False
    assert not hasattr(ray_worker, "print_to_stdstream")


def test_the_filter_is_marked_and_a_second_call_keeps_it(printer):
    original = ray_worker.print_to_stdstream
    assert ray_notices.drop_worker_death_notices() is True
    filtered = ray_worker.print_to_stdstream
    assert filtered is not original
    assert filtered.drops_death_notices is True
    assert ray_notices.drop_worker_death_notices() is True
    assert ray_worker.print_to_stdstream is filtered  # not wrapped a second time
    filtered({"lines": ["out of memory", NOTICE], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    assert printer == [("raylet", ["out of memory"], False)]


def test_an_unmarked_printer_gets_wrapped(printer):
    # a printer with no mark (or a false one) is Ray's own and is wrapped
    original = ray_worker.print_to_stdstream
    original.drops_death_notices = False
    assert ray_notices.drop_worker_death_notices() is True
    assert ray_worker.print_to_stdstream is not original
    ray_worker.print_to_stdstream({"lines": [NOTICE], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    assert printer == []
