"""IntegratedWorker's other paths, in this process with stand-in engines and rollout (no Ray, no model):
what initialize builds, the rollout's log-probs and lengths, the update's averaged metrics and the
rollout-drift metrics, a run without a reference model, shutdown and the HF export."""
import dataclasses
from pathlib import Path

import pytest
import torch

import mindspeed_rl.workers.engine_worker as engine_worker
import mindspeed_rl.workers.integrated_worker as iw
from mindspeed_rl.plan import build_configs, load_config
from mindspeed_rl.data.columnar import ColumnBatch
from mindspeed_rl.workers.parallel_state import ParallelState
from tests.ut.workers.engine_stand_in import RecordsCheckpoints

TINY = Path(__file__).resolve().parents[3] / "configs" / "grpo_tiny_cpu.yaml"
POLICY_LP = -0.5  # every token's log-prob under the stand-in policy


class Engine(RecordsCheckpoints):
    """Stands in for CausalLMEngine: records how it was built and what it was asked."""

    def __init__(self, model_path, **kwargs):
        self.model_path, self.kwargs = model_path, kwargs
        self.losses, self.ref_seen, self.saved = [], [], []

    def train_step(self, prompts, responses, parts, loss_fn, token_count, **kwargs):
        self.train_kwargs, self.token_count, self.parts = kwargs, token_count, parts
        losses = []
        for idx in parts:
            # entropy 2.0 per token, computed only when the worker asks for it
            entropy = [torch.full((responses[i].numel(),), 2.0) for i in idx] if kwargs["with_entropy"] else None
            loss, metrics = loss_fn(idx, [torch.full((responses[i].numel(),), POLICY_LP) for i in idx], entropy)
            losses.append(float(loss))
        self.losses.append(losses)
        return {"actor/loss": sum(losses), "actor/steps": float(len(self.losses))}

    def log_probs(self, prompts, responses, parts, temperature=1.0):
        self.ref_seen.append((len(prompts), [list(p) for p in parts], temperature))
        return [torch.full((r.numel(),), -1.0) for r in responses], None



class Rollout:
    """Stands in for a rollout backend: responses of 1 + (first prompt token) tokens, log-probs -0.25 each."""

    def __init__(self, with_log_probs):
        self.with_log_probs = with_log_probs
        self.changed, self.closed, self.calls = 0, 0, []

    def generate(self, prompts, sampling, seeds, eos_id, pad_id, budgets=None):
        self.calls.append((list(seeds), eos_id, pad_id))
        responses = [torch.arange(1 + int(p[0])) for p in prompts]
        log_probs = [torch.full((r.numel(),), -0.25) for r in responses] if self.with_log_probs else None
        return type("Result", (), {"responses": responses, "log_probs": log_probs})()

    def weights_changed(self):
        self.changed += 1

    def close(self):
        self.closed += 1


def _worker(monkeypatch, *overrides, drift=False, rank=0):
    made = []

    def make_backend(spec, actor, model_path, device, rank_, world, seed, trust_remote_code):
        made.append(dict(spec=spec, actor=actor, model_path=model_path, device=device, rank=rank_, world=world,
                         seed=seed, trust_remote_code=trust_remote_code))
        return Rollout(spec.returns_log_probs)

    monkeypatch.setattr(iw, "CausalLMEngine", Engine)
    monkeypatch.setattr(iw, "make_backend", make_backend)
    monkeypatch.setattr(engine_worker, "seed_all", lambda seed, deterministic: None)
    plan = build_configs(load_config(TINY, ["megatron_training.model_path=/unused", *overrides])).plan
    if drift:  # a vLLM rollout that returns its log-probs (vLLM cannot run the tiny model on CPU)
        spec = dataclasses.replace(plan.worker.rollout, backend="vllm", logprobs=0)
        plan = dataclasses.replace(plan, worker=dataclasses.replace(plan.worker, rollout=spec))
    w = iw.IntegratedWorker(rank=rank, world_size=plan.layout.world_size, run_plan=plan)
    w.parallel_state = ParallelState.from_layout(rank, plan.layout)
    assert w.initialize("/model", eos_id=13, pad_id=14) == rank
    return w, plan, made


def test_initialize_builds_the_actor_the_reference_and_the_rollout(monkeypatch):
    w, plan, made = _worker(monkeypatch, "generate_config.trust_remote_code=true", "rl_config.seed=77", rank=1)
    assert plan.uses_reference and (w.eos_id, w.pad_id) == (13, 14)
    assert w.actor.model_path == w.ref.model_path == "/model"
    assert w.actor.kwargs["trainable"] is True and w.actor.kwargs["dtype"] == torch.float32
    # the reference is frozen, fp32 on CPU (no bf16 compute there), built like the actor otherwise
    assert w.ref.kwargs["trainable"] is False and w.ref.kwargs["dtype"] == torch.float32
    assert w.ref.kwargs["pad_id"] == 14 and w.ref.kwargs["device"] == w.device
    assert made == [dict(spec=plan.worker.rollout, actor=w.actor, model_path="/model", device=w.device, rank=1,
                         world=plan.layout.world_size, seed=77, trust_remote_code=True)]


def test_without_a_kl_term_there_is_no_reference_model(monkeypatch):
    w, plan, _ = _worker(monkeypatch, "rl_config.init_kl_coef=0")
    assert not plan.uses_reference and w.ref is None


def _prompts(*firsts):
    return {"prompts": [torch.tensor([f, 9, 9]) for f in firsts]}


@pytest.mark.parametrize("drift", [False, True])
def test_rollout_returns_responses_lengths_and_the_engines_log_probs(monkeypatch, drift):
    w, plan, _ = _worker(monkeypatch, drift=drift)
    metrics, out = w.generate_sequences([_prompts(2, 0), _prompts(4)], [[0, 1], [5]], iteration=2)
    assert [r.numel() for r in out["responses"]] == [3, 1, 5]
    assert all(t.dtype == torch.int32 and t.shape == (1,) for t in out["response_length"])
    assert [int(t) for t in out["response_length"]] == [3, 1, 5]
    if drift:
        assert [lp.numel() for lp in out["rollout_log_probs"]] == [3, 1, 5]
        assert sorted(out) == ["response_length", "responses", "rollout_log_probs"]
    else:
        assert sorted(out) == ["response_length", "responses"]
    # tokens of this rank: prompt + response of every row
    assert metrics["tokens/actor_rollout"] == (3 + 3) + (3 + 1) + (3 + 5) == metrics["load/actor_rollout"]
    assert metrics["timing/actor_rollout"] >= 0 and metrics["rank"] == 0.0
    seed = plan.worker.sampling.seed if plan.worker.sampling.seed is not None else plan.seed
    assert w.rollout.calls == [([iw.rollout_seed(seed, 2, 0), iw.rollout_seed(seed, 2, 1)], 13, 14),
                               ([iw.rollout_seed(seed, 2, 5)], 13, 14)]


def test_the_rollout_iteration_defaults_to_the_first(monkeypatch):
    w, plan, _ = _worker(monkeypatch)
    w.generate_sequences([_prompts(1)], [[3]])
    assert w.rollout.calls[0][0] == [iw.rollout_seed(plan.seed, 0, 3)]


def test_the_update_has_no_kl_term_by_default(monkeypatch):
    w, _, _ = _worker(monkeypatch)
    w.update([_train_batch()])
    w.update([_train_batch()], kl_coef=0.0)
    assert sum(w.actor.losses[0]) == pytest.approx(sum(w.actor.losses[1])) == pytest.approx(-7)


def _train_batch(rows=2, old=-0.5, drift=None, sign=1.0):
    """Rows of 1 and 3 response tokens (advantages 1 and 2, times ``sign``); ``drift``: the rollout's log-prob
    per token."""
    responses = [torch.ones(n, dtype=torch.long) for n in (1, 3)][:rows]
    columns = {"prompts": [torch.ones(2, dtype=torch.long)] * rows, "responses": responses,
               "prompt_length": [torch.tensor([2])] * rows,
               "response_length": [torch.tensor([r.numel()]) for r in responses],
               "advantages": [torch.tensor([sign]), torch.tensor([2.0 * sign])][:rows],
               "old_log_prob": [torch.full((r.numel(),), old) for r in responses],
               "ref_log_prob": [torch.full((r.numel(),), -2.0) for r in responses]}
    if drift is not None:
        columns["rollout_log_probs"] = [torch.full((r.numel(),), drift) for r in responses]
    return ColumnBatch(columns)


def test_update_averages_the_mini_batches_metrics_and_marks_the_weights_changed(monkeypatch):
    w, plan, _ = _worker(monkeypatch, "rl_config.epochs=2")
    metrics, out = w.update([_train_batch(), _train_batch(rows=1)], kl_coef=0.0)
    assert out is None and w.rollout.changed == 1
    assert metrics["actor/steps"] == pytest.approx((1 + 2 + 3 + 4) / 4)  # 2 mini-batches x 2 epochs
    assert metrics["actor/loss"] == pytest.approx(sum(sum(step) for step in w.actor.losses) / 4)
    # the train stage's tokens: every row's prompt + response, once
    assert metrics["tokens/actor_train"] == (2 + 1) + (2 + 3) + (2 + 1)


def test_update_without_rows_has_only_the_timing(monkeypatch):
    w, _, _ = _worker(monkeypatch)
    metrics, _ = w.update([], kl_coef=0.0)
    assert "actor/loss" not in metrics and metrics["tokens/actor_train"] == 0.0 and w.rollout.changed == 1


def test_off_policy_ratios_use_the_stored_old_log_probs(monkeypatch):
    # the ratio exp(policy - old) is 1 when old = policy; with old = -1.5 every ratio is e and is clipped
    w, plan, _ = _worker(monkeypatch, "rl_config.init_kl_coef=0")
    assert plan.computes_old_log_prob
    w.update([_train_batch(old=POLICY_LP)], kl_coef=0.0)
    w.update([_train_batch(old=-1.5)], kl_coef=0.0)
    same, clipped = (sum(step) for step in w.actor.losses)
    assert same == pytest.approx(-(1 * 1 + 2 * 3))  # -(A summed over tokens), ratio 1 (the engine divides)
    assert clipped == pytest.approx(1.2 * same)  # ratio e, clipped to 1 + clip_ratio


def test_on_policy_ratios_are_one_whatever_the_batch_holds(monkeypatch):
    w, plan, _ = _worker(monkeypatch, "rl_config.init_kl_coef=0", "rl_config.mini_batch_size=8")
    assert not plan.computes_old_log_prob
    w.update([_train_batch(old=-7.0)], kl_coef=0.0)
    assert sum(w.actor.losses[0]) == pytest.approx(-(1 * 1 + 2 * 3))


def test_the_reference_enters_the_loss_only_with_a_reference_model(monkeypatch):
    w, _, _ = _worker(monkeypatch)
    for coef in (0.0, 0.5):
        w.update([_train_batch(old=POLICY_LP)], kl_coef=coef)
    plain, with_kl = (sum(step) for step in w.actor.losses)
    # the reference (-2.0) is far from the policy (-0.5): a positive KL term
    assert plain == pytest.approx(-(1 * 1 + 2 * 3)) and with_kl > plain + 0.1
    w, _, _ = _worker(monkeypatch, "rl_config.init_kl_coef=0")
    batch = _train_batch(old=POLICY_LP)
    del batch["ref_log_prob"]  # a run without a reference has no such column
    w.update([batch], kl_coef=0.0)
    assert sum(w.actor.losses[0]) == pytest.approx(plain)


@pytest.mark.parametrize("on_policy", [True, False])
def test_drift_compares_the_rollouts_log_probs_with_the_trainers(monkeypatch, on_policy):
    extra = ("rl_config.mini_batch_size=8",) if on_policy else ()
    w, plan, _ = _worker(monkeypatch, "rl_config.init_kl_coef=0", *extra)
    metrics, _ = w.update([_train_batch(old=-1.0, drift=-0.25)], kl_coef=0.0)
    # the trainer's view: its own log-probs (-0.5) on-policy, the stored old log-probs (-1.0) otherwise
    d = (POLICY_LP if on_policy else -1.0) - (-0.25)
    assert metrics["actor/rollout_log_prob_abs_diff"] == pytest.approx(abs(d))
    assert metrics["actor/rollout_log_prob_k3_kl"] == pytest.approx(float(torch.expm1(torch.tensor(d))) - d)


def test_an_on_policy_update_with_drift_keeps_the_entropy_bonus(monkeypatch):
    w, _, _ = _worker(monkeypatch, "rl_config.init_kl_coef=0", "rl_config.mini_batch_size=8",
                      "rl_config.entropy_coeff=0.01")
    metrics, _ = w.update([_train_batch(drift=-0.25)], kl_coef=0.0)
    assert sum(w.actor.losses[0]) == pytest.approx(-7 - 0.01 * 2.0 * 4)
    assert metrics["actor/rollout_log_prob_abs_diff"] == pytest.approx(0.25)


def test_no_drift_metrics_without_the_rollouts_log_probs(monkeypatch):
    w, _, _ = _worker(monkeypatch)
    metrics, _ = w.update([_train_batch()], kl_coef=0.0)
    assert not any("rollout_log_prob" in k for k in metrics)


def test_reference_log_probs_use_the_reference_engine_and_its_micro_batches(monkeypatch):
    w, plan, _ = _worker(monkeypatch, "rl_config.use_dynamic_bsz=false", "rl_config.ref_forward_micro_batch_size=1")
    metrics, out = w.compute_ref_log_prob([_train_batch()])
    assert w.actor.ref_seen == [] and w.ref.ref_seen == [(2, [[0], [1]], 1.0)]
    assert [lp.tolist() for lp in out["ref_log_prob"]] == [[-1.0], [-1.0] * 3]
    assert metrics["tokens/ref_log_prob"] == 3 + 5


def test_shutdown_closes_the_rollout_once_and_tolerates_none(monkeypatch):
    w, _, _ = _worker(monkeypatch)
    rollout = w.rollout
    w.init_transfer_dock("handle")
    w.shutdown()
    assert rollout.closed == 1 and w.td is None
    w.rollout = None
    w.shutdown()  # no rollout: nothing to close
    fresh = iw.IntegratedWorker(rank=0, world_size=w.world_size, run_plan=w.run_plan)
    fresh.shutdown()  # initialize never ran: the worker has no rollout attribute at all


def test_export_writes_the_actor_and_names_the_folder_on_failure(monkeypatch, tmp_path):
    w, _, _ = _worker(monkeypatch)
    assert w.export_hf(str(tmp_path / "hf")) == str(tmp_path / "hf") and w.actor.saved == [str(tmp_path / "hf")]
    bad = str(tmp_path / "bad")
    with pytest.raises(RuntimeError) as info:
        w.export_hf(bad)
    assert str(info.value).startswith(f"exporting HF weights into {bad!r} failed: ")
    assert "No space left on device" in str(info.value)


def test_loading_a_checkpoint_marks_the_rollouts_weights_stale(monkeypatch, tmp_path):
    w, plan, _ = _worker(monkeypatch)
    assert w.save_checkpoint(str(tmp_path)) == str(tmp_path)
    # by default the optimizer state and this rank's random streams are saved, and loaded again
    assert w.actor.saved == [(str(tmp_path / "dcp"), True)] and (tmp_path / "rng" / "rank0.pt").is_file()
    assert w.load_checkpoint(str(tmp_path), iteration=2) == 2
    assert w.actor.loaded == (str(tmp_path / "dcp"), True) and w.actor.step == 2 * plan.steps_per_iteration
    assert w.rollout.changed == 1
    w.load_checkpoint(str(tmp_path), iteration=1, with_optimizer=False)
    assert w.actor.loaded == (str(tmp_path / "dcp"), False) and w.rollout.changed == 2


def test_rollout_seeds_use_all_63_bits():
    seeds = [iw.rollout_seed(1234, 0, row) for row in range(256)]
    assert all(0 <= s < 2 ** 63 for s in seeds)
    for bit in range(63):  # uniform seeds: every bit is set in some and clear in others
        ones = sum(s >> bit & 1 for s in seeds)
        assert 0 < ones < len(seeds), bit
    # the low 31 bits and the next ones come from different words: no seed repeats one half in the other
    assert len({(s >> 32) ^ (s & (2 ** 31 - 1)) for s in seeds}) == len(seeds)


def test_rollout_seed_takes_any_integer_seed():
    # the base seed is taken modulo 2**63: a negative or a too-large seed is a valid one
    assert iw.rollout_seed(2 ** 63 + 5, 1, 2) == iw.rollout_seed(5, 1, 2)
    assert iw.rollout_seed(-1, 1, 2) == iw.rollout_seed(2 ** 63 - 1, 1, 2)
    assert iw.rollout_seed(5, 1, 2) != iw.rollout_seed(5, 2, 1)


def test_dapo_clip_bounds_reach_the_loss(monkeypatch):
    # off-policy ratios of e (old -1.5) and 1/e (old 0.5) against the policy's -0.5: both get clipped
    up, down = _train_batch(old=-1.5), _train_batch(old=0.5, sign=-1.0)
    w, _, _ = _worker(monkeypatch, "rl_config.init_kl_coef=0")
    w.update([up, down], kl_coef=0.0)
    assert [sum(step) for step in w.actor.losses] == pytest.approx([-1.2 * 7, 0.8 * 7])  # clip_ratio 0.2 both ways
    w, _, _ = _worker(monkeypatch, "rl_config.init_kl_coef=0", "rl_config.clip_ratio=0.3")
    w.update([up, down], kl_coef=0.0)
    assert [sum(step) for step in w.actor.losses] == pytest.approx([-1.3 * 7, 0.7 * 7])
    w, _, _ = _worker(monkeypatch, "rl_config.init_kl_coef=0", "rl_config.clip_higher_enable=true",
                      "rl_config.clip_ratio_low=0.05", "rl_config.clip_ratio_high=0.28")
    w.update([up, down], kl_coef=0.0)
    assert [sum(step) for step in w.actor.losses] == pytest.approx([-1.28 * 7, 0.95 * 7])


@pytest.mark.parametrize("kind, per_token", [("kl", 1.5), ("low_var_kl", float(torch.exp(torch.tensor(-1.5))) + 0.5)])
def test_the_kl_estimator_of_the_spec_is_used(monkeypatch, kind, per_token):
    w, _, _ = _worker(monkeypatch, f"rl_config.kl_penalty={kind}")
    for coef in (0.0, 0.5):
        w.update([_train_batch()], kl_coef=coef)
    plain, with_kl = (sum(step) for step in w.actor.losses)
    # policy -0.5, reference -2.0 on each of the 4 tokens
    assert with_kl - plain == pytest.approx(0.5 * per_token * 4, rel=1e-5)


def test_an_entropy_bonus_asks_the_engine_for_entropy(monkeypatch):
    w, _, _ = _worker(monkeypatch, "rl_config.init_kl_coef=0")
    w.update([_train_batch()], kl_coef=0.0)
    assert w.actor.train_kwargs["with_entropy"] is False
    w, _, _ = _worker(monkeypatch, "rl_config.init_kl_coef=0", "rl_config.entropy_coeff=0.01")
    metrics, _ = w.update([_train_batch()], kl_coef=0.0)
    assert w.actor.train_kwargs["with_entropy"] is True
    assert sum(w.actor.losses[0]) == pytest.approx(-7 - 0.01 * 2.0 * 4)  # entropy 2.0 on each of 4 tokens


def test_the_token_count_is_summed_over_the_dp_group(monkeypatch):
    reduced = []

    def all_reduce(value, op, group):
        reduced.append((value, op, group))
        return value * 3  # as if three DP ranks held as many
    monkeypatch.setattr("mindspeed_rl.workers.engine_worker.all_reduce_scalar", all_reduce)
    w, plan, _ = _worker(monkeypatch, "generate_config.sampling_config.temperature=0.5")
    w.parallel_state.dp_group = "the DP group"
    w.update([_train_batch()], kl_coef=0.0)
    assert reduced == [(4.0, "sum", "the DP group")] and w.actor.token_count == 12.0
    assert w.actor.train_kwargs["dp_size"] == plan.layout.dp and w.actor.train_kwargs["temperature"] == 0.5


def test_only_the_update_syncs_its_micro_batch_count(monkeypatch):
    synced = []
    monkeypatch.setattr(engine_worker, "sync_micro_batch_count", lambda n, group: synced.append((n, group)) or n)
    w, _, _ = _worker(monkeypatch, "rl_config.use_dynamic_bsz=false", "actor_config.micro_batch_size=1",
                      "rl_config.ref_forward_micro_batch_size=1")
    w.parallel_state.dp_group = "dp"
    w.compute_ref_log_prob([_train_batch()])
    assert synced == []  # a forward pass needs no equal count over the ranks
    w.update([_train_batch()], kl_coef=0.0)
    assert synced == [(2, "dp")] and w.actor.parts == [[0], [1]]  # micro_batch_size 1: one row each


def test_reference_log_probs_cover_every_share(monkeypatch):
    w, _, _ = _worker(monkeypatch)
    metrics, out = w.compute_ref_log_prob([_train_batch(), _train_batch(rows=1)])
    assert [lp.numel() for lp in out["ref_log_prob"]] == [1, 3, 1]
    assert metrics["tokens/ref_log_prob"] == (2 + 1) + (2 + 3) + (2 + 1)
