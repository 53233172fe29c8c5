"""VLLMRollout over a stand-in `vllm` package: the engine's settings, the sampling parameters of a row, the
weights streamed into the engine, generate's requests and answers, close. The real engine runs in
test_vllm_rollout.py; these pin what is passed to it, cheaply enough for the mutation loop."""
import logging
import os
import sys
import types
import warnings
from types import SimpleNamespace

import pytest
import torch
from transformers import Qwen2Config

from mindspeed_rl.plan.rollout_spec import RolloutSpec
from mindspeed_rl.models.rollout import vllm_backend
from mindspeed_rl.models.rollout.base import RolloutResult
from mindspeed_rl.models.rollout.vllm_backend import VLLMRollout, cpu_bind, kv_cache_bytes

TOTAL_MEMORY = 64 * 2 ** 30
CORES = {0, 1, 2, 3, 4, 5, 6, 7}


class StandInLLM:
    built = []

    def __init__(self, **kwargs):
        self.kwargs, self.rpcs, self.calls = kwargs, [], []
        StandInLLM.built.append(self)

    def collective_rpc(self, method, kwargs):
        self.rpcs.append((method, [(n, t.clone()) for n, t in kwargs["weights_iterator"]],
                          kwargs["is_checkpoint_format"]))

    def generate(self, requests, params, use_tqdm=True):
        self.calls.append((requests, params, use_tqdm))
        out = []
        for request in requests:
            ids = [t + 1 for t in request["prompt_token_ids"]]  # a response made from the prompt
            steps = [{t: SimpleNamespace(logprob=-0.5 * t), t + 100: SimpleNamespace(logprob=-9.0)} for t in ids]
            out.append(SimpleNamespace(outputs=[SimpleNamespace(token_ids=tuple(ids), logprobs=steps)]))
        return out


class Params:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


@pytest.fixture
def fake_vllm(monkeypatch, tmp_path):
    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.SamplingParams = StandInLLM, Params
    sampling = types.ModuleType("vllm.sampling_params")
    sampling.RequestOutputKind = SimpleNamespace(FINAL_ONLY="final only")
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sampling)
    for key in ("VLLM_CPU_OMP_THREADS_BIND", "LOCAL_WORLD_SIZE", "LOCAL_RANK", "VLLM_ENABLE_V1_MULTIPROCESSING",
                "VLLM_LOGGING_LEVEL"):
        monkeypatch.setenv(key, "")  # recorded, so what the engine start sets is undone after the test
        monkeypatch.delenv(key)
    monkeypatch.setattr(logging.getLogger("vllm.triton_utils.importing"), "level", logging.NOTSET)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(CORES) if pid == 0 else pytest.fail("pid"))
    import psutil
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(total=TOTAL_MEMORY))
    StandInLLM.built.clear()
    config = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128)
    config.save_pretrained(tmp_path)
    with warnings.catch_warnings():  # the engine start adds a warnings filter
        yield str(tmp_path), config


def _actor(dtype=torch.float32):
    return SimpleNamespace(module=torch.nn.Linear(3, 2).to(dtype))


def _spec(**kw):
    settings = dict(backend="vllm", reason="test", dtype="bfloat16", max_num_seqs=4, max_model_len=96,
                    max_num_batched_tokens=512, logprobs=0)
    settings.update(kw)
    return RolloutSpec(**settings)


def test_a_cpu_engine_gets_the_settings_its_cores_and_a_kv_cache_within_its_share(fake_vllm, monkeypatch):
    path, config = fake_vllm
    from transformers import AutoConfig
    read, real = [], AutoConfig.from_pretrained.__func__
    monkeypatch.setattr(AutoConfig, "from_pretrained",
                        classmethod(lambda cls, *a, **k: read.append(k) or real(cls, *a, **k)))
    spec = _spec(enable_prefix_caching=True, enforce_eager=True)
    rollout = VLLMRollout(spec, _actor(), path, torch.device("cpu"), rank=1, world_size=4, seed=7.0,
                          trust_remote_code=True)
    kwargs = StandInLLM.built[-1].kwargs
    assert rollout.llm is StandInLLM.built[-1] and rollout.stale is False
    assert rollout.dtype == torch.bfloat16
    assert {k: v for k, v in kwargs.items() if k != "kv_cache_memory_bytes"} == dict(
        model=path, skip_tokenizer_init=True, dtype=torch.bfloat16, seed=7, max_model_len=96, max_num_seqs=4,
        max_num_batched_tokens=512, enable_prefix_caching=True, enforce_eager=True, tensor_parallel_size=1,
        trust_remote_code=True, use_tqdm_on_load=False, logprobs_mode="processed_logprobs",
        enable_chunked_prefill=False)  # vLLM's CPU build cannot split a seeded row's prefill
    assert type(kwargs["seed"]) is int
    assert read == [{"trust_remote_code": True}]  # the model config is read as the engine will read it
    # without LOCAL_* the rank and world size decide the node share
    assert kwargs["kv_cache_memory_bytes"] == kv_cache_bytes(config, spec, torch.bfloat16, 4, TOTAL_MEMORY)
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == cpu_bind(1, 4, sorted(CORES)) == "2,3"
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert os.environ["VLLM_LOGGING_LEVEL"] == "ERROR"


def test_local_rank_and_node_size_come_from_the_environment_and_a_set_binding_is_kept(fake_vllm, monkeypatch):
    path, config = fake_vllm
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    spec = _spec(dtype="auto", max_num_batched_tokens=16)
    VLLMRollout(spec, _actor(torch.float64), path, torch.device("cpu"), rank=4, world_size=8, seed=3)
    kwargs = StandInLLM.built[-1].kwargs
    assert kwargs["trust_remote_code"] is False
    assert kwargs["dtype"] == torch.float64  # 'auto': the actor's own dtype
    assert kwargs["max_num_batched_tokens"] == 96  # never below one full sequence
    assert kwargs["kv_cache_memory_bytes"] == kv_cache_bytes(config, spec, torch.float64, 2, TOTAL_MEMORY)
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == cpu_bind(1, 2, sorted(CORES)) == "4,5,6,7"
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    VLLMRollout(spec, _actor(), path, torch.device("cpu"), rank=0, world_size=8, seed=3)
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"


def test_an_accelerator_engine_gets_the_memory_share_and_no_cpu_settings(fake_vllm, monkeypatch):
    path, _ = fake_vllm
    monkeypatch.setattr("transformers.AutoConfig.from_pretrained",
                        lambda *a, **k: pytest.fail("the model config is read for the CPU cache only"))
    VLLMRollout(_spec(gpu_memory_utilization=0.3), _actor(), path, torch.device("meta"), rank=0, world_size=1,
                seed=1)
    kwargs = StandInLLM.built[-1].kwargs
    assert kwargs["gpu_memory_utilization"] == 0.3
    assert "kv_cache_memory_bytes" not in kwargs and "enable_chunked_prefill" not in kwargs
    assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ


def test_a_settings_refusal_of_vllm_becomes_one_picklable_line(fake_vllm, monkeypatch):
    import pickle

    import pydantic

    class Settings(pydantic.BaseModel):
        max_model_len: int

        @pydantic.field_validator("max_model_len")
        @classmethod
        def fits(cls, v):
            raise ValueError(f"User-specified max_model_len ({v}) is greater\nthan the derived max_model_len")

    def refuse(**kwargs):
        Settings(max_model_len=kwargs["max_model_len"])
    monkeypatch.setattr(sys.modules["vllm"], "LLM", refuse)
    path, _ = fake_vllm
    with pytest.raises(ValueError) as info:
        VLLMRollout(_spec(), _actor(), path, torch.device("cpu"), rank=0, world_size=1, seed=1)
    assert type(info.value) is ValueError
    assert str(info.value) == ("vLLM refused its engine settings: Value error, User-specified max_model_len (96) is "
                               "greater than the derived max_model_len")
    assert str(pickle.loads(pickle.dumps(info.value))) == str(info.value)


def _rollout(returns_log_probs=True, dtype=torch.float32):
    rollout = VLLMRollout.__new__(VLLMRollout)  # no engine start: the stand-in LLM is set by hand
    rollout.settings = _spec(logprobs=0 if returns_log_probs else None)
    rollout.llm, rollout.dtype, rollout.stale = StandInLLM(), dtype, False
    return rollout


def test_sampling_params_follow_the_settings_and_greedy_turns_sampling_off(fake_vllm):
    sampling = SimpleNamespace(max_tokens=12, temperature=0.7, top_p=0.9, top_k=5, min_p=0.1)
    params = _rollout()._params(sampling, 11.0, eos_id=2)
    assert params.__dict__ == dict(n=1, max_tokens=12, temperature=0.7, top_p=0.9, top_k=5, min_p=0.1, seed=11,
                                   stop_token_ids=[2], ignore_eos=False, logprobs=0, detokenize=False,
                                   output_kind="final only")
    assert type(params.seed) is int
    greedy = _rollout(returns_log_probs=False)._params(
        SimpleNamespace(max_tokens=3, temperature=0.0, top_p=0.9, top_k=5, min_p=0.1), 4, eos_id=None)
    assert (greedy.temperature, greedy.top_p, greedy.top_k, greedy.min_p) == (0.0, 1.0, 0, 0.0)
    assert greedy.stop_token_ids is None and greedy.ignore_eos is True and greedy.logprobs is None
    no_top_k = _rollout()._params(SimpleNamespace(max_tokens=3, temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0),
                                  4, eos_id=0)
    assert no_top_k.top_k == 0 and no_top_k.stop_token_ids == [0] and no_top_k.ignore_eos is False
    one = _rollout()._params(SimpleNamespace(max_tokens=3, temperature=1.0, top_p=1.0, top_k=1, min_p=0.0), 4, 0)
    assert one.top_k == 1
    below_zero = _rollout()._params(SimpleNamespace(max_tokens=3, temperature=-1.0, top_p=1.0, top_k=0, min_p=0.0),
                                    4, 0)
    assert below_zero.temperature == 0.0 and below_zero.top_p == 1.0  # any temperature <= 0 is greedy


class _Distributed(torch.nn.Parameter):
    """A parameter that stands for a DTensor shard: its full tensor is another one."""

    def full_tensor(self):
        return torch.full(self.shape, 5.0)


def test_weights_stream_every_name_of_a_tied_weight_as_a_full_tensor_in_the_rollout_dtype(monkeypatch):
    monkeypatch.setattr(vllm_backend, "DTensor", _Distributed)
    module = torch.nn.Module()
    module.embed = torch.nn.Parameter(torch.ones(2, 3))
    module.head = module.embed  # tied: one parameter, two names
    module.sharded = _Distributed(torch.zeros(4))
    rollout = _rollout(dtype=torch.bfloat16)
    rollout.actor = SimpleNamespace(module=module)
    rollout.stale = True
    rollout.sync_weights()
    (method, weights, checkpoint_format), = rollout.llm.rpcs
    assert method == "reload_weights" and checkpoint_format is True
    assert [n for n, _ in weights] == ["embed", "head", "sharded"]
    assert all(t.dtype == torch.bfloat16 and not t.requires_grad for _, t in weights)
    assert weights[0][1].tolist() == [[1.0] * 3] * 2
    assert weights[2][1].tolist() == [5.0] * 4  # the gathered tensor, not the local shard
    assert rollout.stale is False


def test_prepare_syncs_only_after_the_weights_changed():
    rollout = _rollout()
    rollout.actor = SimpleNamespace(module=torch.nn.Linear(1, 1))
    rollout.prepare()
    assert rollout.llm.rpcs == []
    rollout.weights_changed()
    assert rollout.stale is True
    rollout.prepare()
    assert len(rollout.llm.rpcs) == 1 and rollout.stale is False


def test_generate_sends_one_request_per_prompt_with_its_seed_and_reads_the_sampled_tokens_log_probs(fake_vllm):
    rollout = _rollout()
    sampling = SimpleNamespace(max_tokens=4, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # log-probs stay float32 whatever the default
    try:
        result = rollout.generate([torch.tensor([[3, 4]]), torch.tensor([7])], sampling, [21, 22], eos_id=9,
                                  pad_id=0)
    finally:
        torch.set_default_dtype(default)
    (requests, params, use_tqdm), = rollout.llm.calls
    assert requests == [{"prompt_token_ids": [3, 4]}, {"prompt_token_ids": [7]}]
    assert [p.seed for p in params] == [21, 22] and use_tqdm is False
    assert [p.stop_token_ids for p in params] == [[9], [9]]
    assert [r.tolist() for r in result.responses] == [[4, 5], [8]]
    assert all(r.dtype == torch.int32 for r in result.responses)
    assert [lp.tolist() for lp in result.log_probs] == [[-2.0, -2.5], [-4.0]]
    assert all(lp.dtype == torch.float32 for lp in result.log_probs)
    plain = _rollout(returns_log_probs=False).generate([torch.tensor([1])], sampling, [1], None, 0)
    assert plain.log_probs is None and [r.tolist() for r in plain.responses] == [[2]]


def test_generate_with_no_prompts_still_syncs_changed_weights_first():
    for returns_log_probs, empty in ((True, []), (False, None)):
        rollout = _rollout(returns_log_probs)
        rollout.actor = SimpleNamespace(module=torch.nn.Linear(1, 1))
        rollout.weights_changed()
        result = rollout.generate([], None, [], None, 0)
        assert result == RolloutResult([], empty)
        assert len(rollout.llm.rpcs) == 1 and rollout.llm.calls == []


def test_one_rank_on_a_node_takes_every_core():
    assert cpu_bind(0, 1, [3, 1, 2, 0]) == "0,1,2,3"
    assert cpu_bind(0, 0, [0, 1]) == "0,1"  # no count of ranks: one


def test_kv_cache_size_from_the_text_config_head_dim_and_dtype():
    vision = SimpleNamespace(text_config=SimpleNamespace(num_hidden_layers=3, num_attention_heads=5,
                                                         head_dim=None, hidden_size=101))
    spec = _spec(max_num_seqs=7, max_model_len=10000, gpu_memory_utilization=0.5)
    need = 2 * 3 * 5 * (101 // 5) * 2 * 7 * 10000  # k and v, layers, heads (no kv heads), head size, bf16 bytes
    assert kv_cache_bytes(vision, spec, torch.bfloat16, 1, 2 ** 40) == -(-need * 5 // 4)
    explicit = SimpleNamespace(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=48,
                               hidden_size=64)
    assert kv_cache_bytes(explicit, spec, torch.float32, 1, 2 ** 40) == -(-(2 * 2 * 2 * 48 * 4 * 70000) * 5 // 4)
    # one rank on the node may take its whole share; a tiny model still gets 16 MiB
    assert kv_cache_bytes(explicit, spec, torch.float32, 1, 10 ** 8) == 5 * 10 ** 7
    assert kv_cache_bytes(explicit, _spec(max_num_seqs=1, max_model_len=1), torch.float32, 1, 2 ** 40) == 16 * 2 ** 20


def test_close_drops_the_engine_and_can_be_called_again():
    rollout = _rollout()
    rollout.close()
    assert rollout.llm is None
    rollout.close()
    bare = VLLMRollout.__new__(VLLMRollout)  # a start that failed before the engine existed
    bare.close()
    assert bare.llm is None


class Engine:
    """vLLM's LLMEngine as serve uses it; a request finishes after LENGTH[row] steps."""
    LENGTH = {7: 2, 8: 2}

    def __init__(self):
        self.added, self.live = [], {}

    def add_request(self, rid, prompt, params):
        self.added.append((rid, prompt, params))
        self.live[rid] = [self.LENGTH[int(rid[3:])], []]

    def step(self):
        done = []
        for rid, entry in list(self.live.items()):
            entry[1].append(len(entry[1]) + 40)
            if len(entry[1]) == entry[0]:
                del self.live[rid]
                ids = list(entry[1])
                logprobs = [{t: SimpleNamespace(logprob=-t / 100)} for t in ids]
                done.append(SimpleNamespace(request_id=rid, finished=True,
                                            outputs=[SimpleNamespace(token_ids=ids, logprobs=logprobs, finish_reason="stop")]))
        # a request that is still running is reported too, unfinished
        return done + [SimpleNamespace(request_id=r, finished=False) for r in self.live]


class Scripted:
    """A queue source whose polls answer in a set order: None (nothing yet), rows, or 'drain'."""

    def __init__(self, answers):
        self.answers, self.wants, self.blocks, self.drained = list(answers), [], [], False

    def request(self, want, progress):
        self.wants.append(want)
        progress()

    def poll(self, block):
        self.blocks.append(block)
        answer = self.answers.pop(0)
        if answer == "drain":
            self.drained = True
            return None
        return answer


def _served(returns_log_probs):
    from mindspeed_rl.balance.rollout_queue import Rows
    rollout = _rollout(returns_log_probs)
    rollout.settings = _spec(max_num_seqs=2, logprobs=0 if returns_log_probs else None)
    rollout.llm = SimpleNamespace(llm_engine=Engine())
    rows = Rows([0, 1], [7, 8], {"prompts": [torch.tensor([[1, 2, 3]]), torch.tensor([4])]})
    source = Scripted([None, rows, None, "drain"])
    sampling = SimpleNamespace(max_tokens=6, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0)
    clock = iter(range(10, 100))
    served = rollout.serve(source, sampling, lambda row: 500 + row, eos_id=3, pad_id=0, chunk=None,
                           clock=lambda: float(next(clock)))
    return served, source, rollout.llm.llm_engine


def test_serve_waits_for_rows_asks_only_for_free_slots_and_times_its_steps(fake_vllm):
    served, source, engine = _served(returns_log_probs=True)
    # nothing yet, then two rows; while both run the engine is full and asks for none
    assert source.wants == [2, 2, 2] and source.blocks == [True, True, False, True]
    assert [(rid, prompt) for rid, prompt, _ in engine.added] == [("row7", {"prompt_token_ids": [1, 2, 3]}),
                                                                  ("row8", {"prompt_token_ids": [4]})]
    params = [p for _, _, p in engine.added]
    assert [(p.seed, p.max_tokens, p.stop_token_ids) for p in params] == [(507, 6, [3]), (508, 6, [3])]
    assert served.rows == [7, 8] and served.prompt_lengths == [3, 1]
    assert [r.tolist() for r in served.responses] == [[40, 41], [40, 41]]
    assert [lp.tolist() for lp in served.log_probs] == [pytest.approx([-0.4, -0.41])] * 2
    # clock: begin 10, rows admitted at 11, steps 12-13 and 14-15, end 16
    assert served.trace == [(1, 2, 4, 1.0), (1, 2, 0, 1.0)]
    assert served.latency == [4.0, 4.0] and served.busy == 6.0


def test_serve_without_log_probs_keeps_none(fake_vllm):
    served, _, _ = _served(returns_log_probs=False)
    assert served.log_probs is None and served.rows == [7, 8]
