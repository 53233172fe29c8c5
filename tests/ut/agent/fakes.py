"""Stand-ins of the agent tests: a tool in the base class's async shape, a parser of ``CALL name {json}``."""
import asyncio
import re
from types import SimpleNamespace

from mindspeed_rl.models.tiny_text_tokenizer import build_text_tokenizer

TOK = build_text_tokenizer()


class Tool:
    """A tool in the base class's async shape; ``fn(arguments)`` makes its answer."""

    def __init__(self, fn):
        self.fn, self.created, self.released, self.kwargs = fn, 0, 0, []

    async def acreate(self, instance_id=None, **kwargs):
        self.created += 1
        self.kwargs.append(kwargs)
        return "id"

    async def aexecute(self, instance_id, parameters, **kwargs):
        out = self.fn(parameters)
        return (await out) if asyncio.iscoroutine(out) else out

    async def arelease(self, instance_id, **kwargs):
        self.released += 1


class Parser:
    """``CALL name {json}`` lines are calls; ``CALL!`` a malformed one."""

    def parse_text(self, text):
        calls = [SimpleNamespace(name=m.group(1), arguments=m.group(2))
                 for m in re.finditer(r"CALL (\w+) (\{[^}]*\})", text)]
        return calls, ["the call is not JSON"] * text.count("CALL!")
