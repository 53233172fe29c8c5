"""Which mutants `tests/mutation/mutation.py retest` re-runs, and which verdicts it keeps afterwards."""
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
_spec = importlib.util.spec_from_file_location("mutation_tool", os.path.join(ROOT, "tests", "mutation", "mutation.py"))
mutation = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mutation)

F1, F2, F3 = (f"pkg.mod.x_f__mutmut_{i}" for i in (1, 2, 3))
G1, G2 = "pkg.mod.xǁCǁg__mutmut_1", "pkg.mod.xǁCǁg__mutmut_2"
# killed, survived, timeout; survived, unchecked
BEFORE = {F1: 1, F2: 0, F3: -24, G1: 0, G2: None}


def test_targets_are_the_mutants_not_killed_or_those_the_globs_name():
    assert mutation.retest_targets(BEFORE) == sorted([F2, F3, G1, G2])
    # a glob on the last part of the name, or on the whole name
    assert mutation.retest_targets(BEFORE, ["xǁCǁg__mutmut_*"]) == [G1, G2]
    assert mutation.retest_targets(BEFORE, ["*x_f__mutmut_[12]", "pkg.mod.xǁCǁg__mutmut_2"]) == sorted([F2, G2])
    assert mutation.retest_targets(BEFORE, ["nothing*"]) == []


def _after(**codes):  # mutmut's meta once it cleared every verdict and ran the targets
    data = {"exit_code_by_key": {k: None for k in BEFORE}, "hash_by_function_name": {"x_f": "a", "xǁCǁg": "b"}}
    data["exit_code_by_key"].update(codes)
    return data


def test_kills_and_every_verdict_outside_the_targets_come_back():
    hashes = {"x_f": "a", "xǁCǁg": "b"}
    data = _after(**{G1: 1})  # only the g mutants re-ran: G1 is killed now, G2 still unchecked
    assert mutation.restore_verdicts(BEFORE, {G1, G2}, data, hashes) == 3
    assert data["exit_code_by_key"] == {F1: 1, F2: 0, F3: -24, G1: 1, G2: None}
    # a plain retest: only the kills come back, the targets keep what they got now
    data = _after(**{F2: 1, G1: 0})
    assert mutation.restore_verdicts(BEFORE, {F2, F3, G1, G2}, data, hashes) == 1
    assert data["exit_code_by_key"] == {F1: 1, F2: 1, F3: None, G1: 0, G2: None}


def test_a_function_whose_source_changed_keeps_nothing():
    data = _after()
    data["hash_by_function_name"]["x_f"] = "changed"
    assert mutation.restore_verdicts(BEFORE, {G1}, data, {"x_f": "a", "xǁCǁg": "b"}) == 0
    assert data["exit_code_by_key"][F1] is None and data["exit_code_by_key"][F2] is None
