"""GTPOTrainer's advantage step on verl's TransferQueue (Ray, CPU): the batch as verl's trainer builds it -- rows as
the agent loop and the old-log-prob pass write them (nested tensors, uid), reordered by balancing, with verl's own
synthetic padding rows -- gives GTPO's token-level advantages, reading `responses` and `entropy` itself."""

import inspect

import numpy as np
import pytest
import torch

from verl_batches import compose, rollout, uid_array

pytest.importorskip("verl")
ray = pytest.importorskip("ray")
tq = pytest.importorskip("transfer_queue")

from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size  # noqa: E402
from verl.trainer.ppo.v1.trainer_base import PPOTrainer  # noqa: E402
from verl.utils.tensordict_utils import list_of_dict_to_tensordict  # noqa: E402

from gtpo.maths import method  # noqa: E402
from gtpo.integrations.verl import GTPOTrainer, check_verl_config, gtpo_token_level_advantages  # noqa: E402


@pytest.fixture(scope="module")
def queue():
    cfg = compose()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    tq_cfg = cfg.transfer_queue
    tq_cfg.backend.SimpleStorage.num_data_storage_units = 1
    tq.init(tq_cfg)
    yield
    tq.close()
    ray.shutdown()


def _trainer(overrides):
    """The trainer as verl's TaskRunnerV1 holds it, without its workers (the advantage step needs none)."""
    cfg = compose(overrides=["actor_rollout_ref.rollout.n=4", "data.max_response_length=10"] + overrides)
    trainer = object.__new__(GTPOTrainer)
    trainer.config, trainer.gtpo_config, trainer.gtpo_initial_entropy = cfg, check_verl_config(cfg), None
    return trainer


def _put(r, seed):
    """The rows in TransferQueue as verl writes them; keys reordered as batch balancing does; verl's padding."""
    N = len(r["uid"])
    rows = []
    for i in range(N):
        n, p = int(r["lengths"][i]), int(r["prompt_len"][i])
        rows.append(dict(uid=r["uid"][i], prompts=torch.full((p,), 1), responses=r["ids"][i, :n],
                         input_ids=torch.cat([torch.full((p,), 1), r["ids"][i, :n]]),
                         attention_mask=torch.ones(p + n, dtype=torch.long),
                         response_mask=torch.ones(n, dtype=torch.long), rm_scores=r["scores"][i, :n],
                         rollout_log_probs=torch.full((n,), -1.0), old_log_probs=torch.full((n,), -1.0),
                         entropy=r["entropy"][i, :n].float()))
    keys = [f"{r['uid'][i]}_{i}_0" for i in range(N)]
    batch = tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(rows),
                            tags=[{"seq_len": len(rows[i]["input_ids"])} for i in range(N)])
    order = np.random.default_rng(seed).permutation(N)
    batch.reorder(order.tolist())
    return upsample_batch_to_divisible_size(batch, 16, eos_token_id=2), order


@pytest.mark.parametrize("preset", ["official", "paper"])
def test_advantage_step_reads_responses_and_entropy_from_the_queue(queue, preset):
    overrides = [] if preset == "official" else ["algorithm.gtpo={preset:paper}", "actor_rollout_ref.rollout.temperature=1.0"]
    trainer = _trainer(overrides)
    r = rollout(7)
    N = len(r["uid"])
    batch, order = _put(r, seed=7)
    assert len(batch) == 16 and sum(tag.get("is_padding", False) for tag in batch.tags) == 16 - N
    metrics = {}
    batch = trainer._compute_advantage(batch, metrics)
    got = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["advantages", "returns"])
    adv = got.to_padded_tensor()["advantages"]
    expected = gtpo_token_level_advantages(r["scores"], r["mask"], uid_array(r["uid"]), r["ids"], r["entropy"].float(),
                                           trainer.gtpo_config)
    T = adv.shape[1]
    torch.testing.assert_close(adv[:N], expected.advantages[order][:, :T], rtol=1e-6, atol=1e-7)
    assert bool((adv[N:] == 0).all())  # verl's padding rows
    assert bool(adv[:N].abs().sum() > 0)
    assert {"gtpo/conflict_frac", "gtpo/filtered_frac", "gtpo/n_conflict_mean"} <= set(metrics)
    if preset == "paper":  # <H>_ini measured on the first batch, kept for the next ones
        seq = method.completion_entropy(r["entropy"].float(), r["mask"])
        assert trainer.gtpo_initial_entropy == pytest.approx(float(seq.mean()), rel=1e-6)
    else:
        assert trainer.gtpo_initial_entropy is None


def test_log_prob_passes_run_at_gtpos_logprob_temperature():
    trainer = _trainer([])  # official: samples at 0.9, log-probs and entropies at 1.0
    rollout_cfg = trainer.config.actor_rollout_ref.rollout
    with trainer._logprob_temperature():
        assert rollout_cfg.temperature == 1.0
    assert rollout_cfg.temperature == 0.9
    # verl reads the temperature from the config when each of the two passes runs (what the override relies on)
    for name in ("_compute_old_log_prob", "_update_actor"):
        assert '"temperature": self.config.actor_rollout_ref.rollout.temperature' in inspect.getsource(
            getattr(PPOTrainer, name)), name
