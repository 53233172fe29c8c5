"""Client of a SandboxFusion server (``sandbox_fusion_url``, ending in ``/run_code``): upstream's payload and
retries, sent with aiohttp (no proxy from the environment)."""
import asyncio
from typing import Optional, Tuple

import aiohttp

# languages a SandboxFusion server runs (upstream's list); others are refused without a request
SUPPORTED_LANGUAGES = (
    "python", "cpp", "nodejs", "go", "go_test", "java", "php", "csharp", "bash", "typescript", "sql", "rust",
    "cuda", "lua", "R", "perl", "D_ut", "ruby", "scala", "julia", "pytest", "junit", "kotlin_script", "jest",
    "verilog", "python_gpu", "lean", "swift", "racket")
RETRY_DELAY_S = 1.0  # back-off after a 504: 1 s, 2 s, ...
HTTP_GRACE_S = 10.0  # a request may take compile_timeout + run_timeout + this


async def call_sandbox_api(sandbox_fusion_url: str, code: str, stdin: Optional[str], compile_timeout: float,
                           run_timeout: float, memory_limit_mb: int, language: str = "python",
                           max_retries: int = 3) -> Tuple[Optional[dict], Optional[str]]:
    """``(response JSON, None)`` or ``(None, one-line error)``; a 504 (gateway timeout) is retried."""
    if language not in SUPPORTED_LANGUAGES:
        return None, f"language {language!r} is not supported by SandboxFusion"
    payload = {"compile_timeout": compile_timeout, "run_timeout": run_timeout, "code": code, "stdin": stdin,
               "memory_limit_MB": memory_limit_mb, "language": language, "files": {}, "fetch_files": []}
    headers = {"Accept": "application/json"}  # aiohttp sets Content-Type: application/json for json=
    timeout = aiohttp.ClientTimeout(total=compile_timeout + run_timeout + HTTP_GRACE_S)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for attempt in range(1, max_retries + 1):
                async with session.post(sandbox_fusion_url, json=payload, headers=headers) as resp:
                    if resp.status == 504 and attempt < max_retries:
                        await asyncio.sleep(RETRY_DELAY_S * attempt)
                        continue
                    if resp.status != 200:
                        return None, f"HTTP {resp.status} from {sandbox_fusion_url}"
                    try:
                        return await resp.json(content_type=None), None
                    except ValueError:
                        return None, f"the answer of {sandbox_fusion_url} is not JSON"
    except asyncio.TimeoutError:
        return None, f"no answer from {sandbox_fusion_url} in {timeout.total:g} s"
    except aiohttp.ClientError as e:
        return None, f"request to {sandbox_fusion_url} failed ({type(e).__name__}: {' '.join(str(e).split())})"
    return None, "no request was made (max_retries < 1)"


def fusion_outcome(response: Optional[dict], error: Optional[str], timeout: float) -> Tuple[str, str]:
    """``(text for the model, status)`` of one call; status is ok / error / timeout / unavailable.
    Upstream answers "no stdout here" to every run that did not finish; this says what happened."""
    if error is not None:
        return f"sandbox unavailable: {error}", "unavailable"
    run = (response or {}).get("run_result") or {}
    run_status = run.get("status")
    if run_status == "Finished":
        text = (run.get("stdout") or "") + (run.get("stderr") or "")
        return text, "ok" if run.get("return_code", 0) == 0 else "error"
    if run_status == "TimeLimitExceeded":
        return f"timeout after {timeout:g} s", "timeout"
    compile_err = ((response or {}).get("compile_result") or {}).get("stderr") or ""
    line = f"not run: sandbox status {(response or {}).get('status')}, run status {run_status}"
    return (line + "\n" + compile_err if compile_err else line), "error"
