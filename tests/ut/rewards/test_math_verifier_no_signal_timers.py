"""math-verify's own timers are off (they use signal.alarm, which only the main thread may use; the
verifier pool times each response itself), and its log is cut to errors."""
import logging
import threading

from mindspeed_rl.rewards import math_verifier as mv


def _in_thread(fn, *args):
    out = {}

    def run():
        try:
            out["value"] = fn(*args)
        except Exception as e:  # noqa: BLE001 - the test reports it
            out["value"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join(60)
    return out["value"]


def test_verifiers_run_outside_the_main_thread():
    assert _in_thread(mv.check_answer, "\\frac{1}{2}", "0.5") == (1.0, "math_verify")
    assert _in_thread(mv.check_answer, "3", "3") == (1.0, "math_verify")
    assert _in_thread(mv.math_verify_reward, "<think>t</think><answer>\\boxed{2}</answer>", "2") == \
        (1.0, "math_verify")


def test_math_verify_log_is_cut_to_errors(monkeypatch):
    log = logging.getLogger("math_verify")
    monkeypatch.setattr(log, "level", logging.NOTSET)
    root = logging.getLogger()
    monkeypatch.setattr(root, "level", root.level)
    mv.check_answer("2", "2")
    assert log.level == logging.ERROR
