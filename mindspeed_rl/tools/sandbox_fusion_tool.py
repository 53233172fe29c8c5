"""``SandboxFusionTool``: runs code the model wrote and answers with its output.

Without ``sandbox_fusion_url`` the code runs in the local sandbox (``mindspeed_rl.tools.sandbox``, Python only);
with it, on that SandboxFusion server (upstream's request). Upstream refuses a tool without a URL; here that
means "run locally". Config keys (upstream's, plus the local sandbox's ``max_processes`` / ``output_bytes``):

    sandbox_fusion_url        None   server URL ending in /run_code; None or "": the local sandbox
    default_timeout           30     seconds a run may take (local: the wall limit, the CPU limit is 1 s
                                     more; remote: run_timeout);
                                     a call's own ``timeout`` argument may ask for less, never for more
    default_language          python a call's language when it names none (local: python only)
    memory_limit_mb           1024   memory of one run
    max_processes             16     processes/threads of one local run
    output_bytes              65536  output kept from one run (local: stdout and stderr each; remote: the
                                     answer); the rest is cut, and the cut is marked
    num_workers               10     runs of this tool at once (in this process)
    rate_limit                10     runs of all tools with enable_global_rate_limit at once (in this process)
    enable_global_rate_limit  True

The answer: stdout + stderr when the code ran (also with a non-zero exit: the traceback is there), else one
line saying what happened (e.g. "timeout after 30 s"; upstream says "no stdout here" for all of these).
Metrics: status (ok / error / timeout / killed / unavailable), wall_seconds, truncated."""
import math
import time
from typing import Any, Dict, Tuple

from mindspeed_rl.tools import sandbox
from mindspeed_rl.tools.base_tool import BaseTool
from mindspeed_rl.tools.utils.concurrency import ConcurrencyLimit, global_limit, limited
from mindspeed_rl.tools.utils.sandbox_fusion import SUPPORTED_LANGUAGES, call_sandbox_api, fusion_outcome
from mindspeed_rl.tools.utils.tool_config import settle_config

DEFAULTS = {"sandbox_fusion_url": None, "default_timeout": 30.0, "default_language": "python",
            "memory_limit_mb": 1024, "max_processes": 16, "output_bytes": 65536, "num_workers": 10,
            "rate_limit": 10, "enable_global_rate_limit": True}


class SandboxFusionTool(BaseTool):
    parameters = frozenset({"code", "timeout", "language"})

    def __init__(self, config: dict, tool_schema=None):
        super().__init__(config, tool_schema)
        self.settings = settle_config(self.config, DEFAULTS)
        self.sandbox_fusion_url = self.settings["sandbox_fusion_url"] or None
        language = self.settings["default_language"]
        if self.sandbox_fusion_url is None:
            if language != "python":
                raise ValueError(f"default_language {language!r} needs sandbox_fusion_url: "
                                 "the local sandbox runs python only")
            problem = sandbox.sandbox_problem()
            if problem is not None:
                raise ValueError(problem)
        elif language not in SUPPORTED_LANGUAGES:
            raise ValueError(f"default_language {language!r} is not one SandboxFusion runs")
        self._own = ConcurrencyLimit(self.settings["num_workers"])
        self._shared = global_limit(self.settings["rate_limit"]) \
            if self.settings["enable_global_rate_limit"] else None

    def prepare_code(self, code: str) -> str:
        """The code to run for the model's ``code`` argument (ReTool edits it)."""
        return code

    def _call_problem(self, parameters: Dict[str, Any]):
        code = parameters.get("code")
        if not isinstance(code, str) or not code.strip():
            return f"error: {self.name} needs a 'code' argument with the code to run"
        timeout = parameters.get("timeout", self.settings["default_timeout"])
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            return f"error: 'timeout' must be a number of seconds > 0, got {timeout!r}"
        language = parameters.get("language", self.settings["default_language"])
        if self.sandbox_fusion_url is None and language != "python":
            return f"error: only python runs here, not {language!r}"
        if language not in SUPPORTED_LANGUAGES:
            return f"error: the sandbox does not run {language!r}"
        return None

    async def execute(self, instance_id: str, parameters: Dict[str, Any], **kwargs) -> Tuple[str, float, dict]:
        problem = self._call_problem(parameters)
        if problem is not None:
            return problem, 0.0, {"status": "error", "wall_seconds": 0.0, "truncated": False}
        timeout = min(parameters.get("timeout", self.settings["default_timeout"]), self.settings["default_timeout"])
        language = parameters.get("language", self.settings["default_language"])
        text, metrics = await self.run_code(self.prepare_code(parameters["code"]), timeout, language)
        return text, 0.0, metrics

    async def run_code(self, code: str, timeout: float, language: str = "python") -> Tuple[str, dict]:
        """``(answer text, metrics)`` of one run, waiting for a free slot first."""
        async with limited(self._own, self._shared):
            if self.sandbox_fusion_url is not None:
                return await self._run_remote(code, timeout, language)
            return await self._run_local(code, timeout)

    async def _run_local(self, code: str, timeout: float) -> Tuple[str, dict]:
        s = self.settings
        # the CPU limit is a second above the wall limit: a busy loop ends as a timeout, while code that burns
        # CPU on many threads at once is stopped by the CPU limit
        limits = sandbox.SandboxLimits(wall_seconds=float(timeout), cpu_seconds=math.ceil(timeout) + 1,
                                       memory_mb=s["memory_limit_mb"], max_processes=s["max_processes"],
                                       output_bytes=s["output_bytes"])
        try:
            result = await sandbox.run_python_async(code, limits)
        except sandbox.SandboxUnavailable as e:
            return f"sandbox unavailable: {e}", {"status": "unavailable", "wall_seconds": 0.0, "truncated": False}
        if result.status in ("ok", "error"):
            text = result.stdout + result.stderr
        elif result.status == "timeout":
            text = f"timeout after {timeout:g} s"
        else:  # killed by a signal: a limit (CPU time, memory) or the code itself
            how = f" by signal {-result.exit_code}" if result.exit_code else ""
            text = f"killed{how} after {result.wall_seconds:.1f} s " \
                   f"(limits: {limits.cpu_seconds} s CPU, {limits.memory_mb} MB memory)"
        return text, {"status": result.status, "wall_seconds": result.wall_seconds,
                      "truncated": result.output_truncated}

    async def _run_remote(self, code: str, timeout: float, language: str) -> Tuple[str, dict]:
        start = time.monotonic()
        response, error = await call_sandbox_api(self.sandbox_fusion_url, code, None, timeout, timeout,
                                                 self.settings["memory_limit_mb"], language)
        text, status = fusion_outcome(response, error, timeout)
        keep = self.settings["output_bytes"]
        data = text.encode("utf-8")
        truncated = len(data) > keep
        if truncated:
            text = data[:keep].decode("utf-8", "ignore") + f"\n...(output cut at {keep} bytes)"
        return text, {"status": status, "wall_seconds": time.monotonic() - start, "truncated": truncated}
