"""What a run's `MetricsLogger` shows: the plain progress lines' ETA (seconds left at the pace of this process's
steps so far)."""

import time

from jaxformer.train.metrics import MetricsLogger


def test_plain_eta_is_paced_by_the_steps_not_the_compile(tmp_path, monkeypatch, capsys):
    """A resumed segment that spends 30 s restoring and compiling, then trains 10 steps in 5 s, has 90 steps left:
    45 s at 0.5 s a step (counting the 30 s as the steps' pace, as the ETA did, said 5m15s: 35 s / 10 × 90)."""
    now = [1000.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    logger = MetricsLogger(tmp_path, start_step=20, total_steps=120, progress="plain", tensorboard=False)
    now[0] += 30.0  # restore and compile, before the first step is dispatched
    for _ in range(10):
        logger.advance()
        now[0] += 0.5
    logger.log({"step": 30, "train_loss": 2.0})
    for _ in range(10):
        logger.advance()
        now[0] += 0.5
    now[0] += 1.0  # an evaluation at step 40: part of the pace, as evaluations recur
    logger.log({"step": 40, "train_loss": 1.5, "val_loss": 1.75})
    for _ in range(80):
        logger.advance()
    logger.log({"step": 120, "train_loss": 1.0})  # the last step: no ETA
    logger.close()
    assert capsys.readouterr().out.splitlines() == [
        "step 30/120 | loss 2.0000 | ETA 0m45s",
        "step 40/120 | loss 1.5000 | val 1.7500 | ETA 0m44s",  # 11 s / 20 steps × 80
        "step 120/120 | loss 1.0000",
    ]
