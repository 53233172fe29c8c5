"""What a tool's answer becomes (answer_text), an error without a message, the seconds of a skipped call, and a
closed runner's loop."""
import json
from types import SimpleNamespace

from mindspeed_rl.agent.tool_runner import ERROR, SKIPPED, CallResult, ToolRunner, answer_text
from mindspeed_rl.tools.schemas import ToolResponse


def test_answer_text_reads_each_answer_form():
    assert answer_text(("plain", 1.0, {})) == "plain"
    assert answer_text(()) == ""
    assert answer_text("plain") == "plain"
    assert answer_text(ToolResponse(text="from verl")) == "from verl"
    assert answer_text(ToolResponse()) == ""
    assert answer_text({"city": "Zürich", "n": [1]}) == '{"city": "Zürich", "n": [1]}'
    assert answer_text(["é"]) == json.dumps(["é"], ensure_ascii=False)
    assert answer_text(True) == "True" and answer_text(2.5) == "2.5"


class Failing:
    """A tool whose execute raises an error without a message."""

    async def acreate(self, instance_id, **kwargs):
        return "i"

    async def aexecute(self, instance_id, arguments):
        raise RuntimeError()

    async def arelease(self, instance_id):
        return None


def test_an_error_without_a_message_is_named_by_its_type_and_skipped_calls_take_no_time():
    runner = ToolRunner({"f": Failing()}, timeout=60.0, max_parallel=1)
    try:
        calls = [SimpleNamespace(name="f", arguments="{}"), SimpleNamespace(name="f", arguments="{}")]
        first, skipped = runner.submit(calls).result(timeout=120)
    finally:
        runner.close()
    assert (first.text, first.status, first.ran) == ("error: f failed: RuntimeError", ERROR, True)
    assert skipped == CallResult("", SKIPPED, 0.0)
    assert isinstance(skipped.seconds, float)
    assert runner.loop.is_closed()


class Recorder:
    """A tool that records its instance ids, arguments and create kwargs."""

    def __init__(self):
        self.seen = []

    async def acreate(self, instance_id, **kwargs):
        self.seen.append(("create", instance_id, kwargs))
        return "inst-7"

    async def aexecute(self, instance_id, arguments):
        self.seen.append(("execute", instance_id, arguments))
        return f"got {sorted(arguments)}", 0.0, {}

    async def arelease(self, instance_id):
        self.seen.append(("release", instance_id))


def test_calls_that_never_reach_a_tool_take_no_time_and_a_run_call_its_own():
    tool = Recorder()
    runner = ToolRunner({"rec": tool}, timeout=60.0, max_parallel=8)
    calls = [SimpleNamespace(name="nope", arguments="{}"), SimpleNamespace(name="rec", arguments="{oops"),
             SimpleNamespace(name="rec", arguments="[1]"), SimpleNamespace(name="rec", arguments={"a": 1}),
             SimpleNamespace(name="rec", arguments=None), SimpleNamespace(arguments="{}")]
    import time
    try:
        start = time.monotonic()
        results = runner.submit(calls, malformed=["tool call 9: bad"], create_kwargs={"ground_truth": "4"}).result(
            timeout=120)
        elapsed = time.monotonic() - start
    finally:
        runner.close()
    nope, bad_json, not_object, as_dict, empty, nameless, malformed = results
    assert nope == CallResult("error: there is no tool named 'nope'; tools: ['rec']", ERROR, 0.0)
    assert bad_json == CallResult("error: the arguments of rec are not JSON: JSONDecodeError: Expecting property "
                                  "name enclosed in double quotes: line 1 column 2 (char 1)", ERROR, 0.0)
    assert not_object == CallResult("error: the arguments of rec must be a JSON object", ERROR, 0.0)
    assert nameless == CallResult("error: there is no tool named None; tools: ['rec']", ERROR, 0.0)
    assert malformed == CallResult("error: tool call 9: bad", ERROR, 0.0)
    assert (as_dict.text, as_dict.status, as_dict.ran, empty.text) == ("got ['a']", "ok", True, "got []")
    assert 0.0 <= as_dict.seconds <= elapsed and 0.0 <= empty.seconds <= elapsed
    assert ("create", None, {"ground_truth": "4"}) in tool.seen
    assert ("execute", "inst-7", {"a": 1}) in tool.seen and ("execute", "inst-7", {}) in tool.seen
    assert tool.seen.count(("release", "inst-7")) == 2
