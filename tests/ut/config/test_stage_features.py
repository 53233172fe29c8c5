"""Which stages a run has follows its Features: the advantage estimator picks group-norm or GAE, and a
row's extra outputs follow the feature flags they name."""
from mindspeed_rl.plan import stages as st


def test_the_estimator_picks_one_advantage_stage():
    gae = st.Features(estimator="gae", critic=True, kl_in_loss=False)
    assert st.GAE_ADV.when(gae) and not st.GROUP_ADV.when(gae)
    norm = st.Features()
    assert st.GROUP_ADV.when(norm) and not st.GAE_ADV.when(norm)


def test_extra_outputs_follow_their_flags():
    assert st.Features(rollout_log_probs=True).has("rollout_log_probs")
    assert not st.Features().has("rollout_log_probs")
    assert st.ROLLOUT.outputs_for(st.Features(rollout_log_probs=True)) == \
        ("responses", "response_length", st.ROLLOUT_LOG_PROBS)
    assert st.ROLLOUT.outputs_for(st.Features()) == ("responses", "response_length")
    assert st.REWARD.outputs_for(st.Features(dynamic_sampling=True)) == ("rm_scores", st.FILTER_METRIC)
