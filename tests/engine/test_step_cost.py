"""The step cost model fits known step times: exact, noisy, with outliers, and drifting."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kvrelay_worker.engine.sched.step_cost import StepCostModel, StepShape, attention_pairs

# a, b, c, d, e of the module docstring: ms, per decode row, per 1000 KV tokens read,
# per prompt token, per million attention pairs.
TRUE = np.array([4.0, 0.8, 0.3, 0.12, 2.5])


def random_shape(rng: random.Random) -> StepShape:
    """A step like the engine's: some decodes, sometimes a prompt chunk deep in a prompt."""
    contexts = [rng.randrange(10, 3000) for _ in range(rng.randrange(0, 32))]
    shape = StepShape.of((c, 1) for c in contexts)
    if rng.random() < 0.6:
        shape = shape.plus_prefill(rng.randrange(0, 6000), rng.randrange(2, 1024))
    return shape


def true_ms(shape: StepShape, coef: np.ndarray = TRUE) -> float:
    return float(np.dot(coef, shape.features()))


def test_shape_of_rows_counts_decodes_and_prompt_attention() -> None:
    shape = StepShape.of([(10, 1), (99, 1), (100, 50), (0, 7)])
    assert shape.decode_rows == 2
    assert shape.decode_kv_tokens == 11 + 100
    assert shape.prefill_tokens == 57
    assert shape.prefill_attention_pairs == attention_pairs(100, 50) + attention_pairs(0, 7)
    assert attention_pairs(0, 3) == 1 + 2 + 3  # causal: query i sees keys 0..i
    assert attention_pairs(5, 2) == 6 + 7


def test_cold_model_predicts_nothing() -> None:
    model = StepCostModel()
    assert model.predict_ms(StepShape(decode_rows=8, prefill_tokens=500)) == 0.0
    assert model.largest_prefill == 0


def test_exact_times_are_recovered() -> None:
    rng = random.Random(0)
    model = StepCostModel()
    for _ in range(80):
        shape = random_shape(rng)
        model.observe(shape, true_ms(shape))
    np.testing.assert_allclose(model.coefficients, TRUE, rtol=0.02, atol=0.05)


def test_noise_and_outliers_barely_move_the_fit() -> None:
    """5% multiplicative noise plus one step in ten stalled by 50-200 ms elsewhere."""
    rng = random.Random(1)
    model = StepCostModel()
    shapes = [random_shape(rng) for _ in range(128)]
    for shape in shapes:
        ms = true_ms(shape) * rng.uniform(0.95, 1.05)
        if rng.random() < 0.1:
            ms += rng.uniform(50, 200)
        model.observe(shape, ms)
    probe = StepShape.of([(500, 1)] * 16).plus_prefill(4000, 256)
    assert model.predict_ms(probe) == pytest.approx(true_ms(probe), rel=0.1)
    # Least squares without the reweighting would be pulled far off by the stalls.
    assert model.coefficients[0] < 15.0


def test_forgetting_follows_a_machine_that_slows_down() -> None:
    rng = random.Random(2)
    model = StepCostModel(forgetting=0.9)
    for _ in range(100):
        shape = random_shape(rng)
        model.observe(shape, true_ms(shape))
    slower = TRUE * 2.0  # e.g. another process now shares the cores
    for _ in range(60):
        shape = random_shape(rng)
        model.observe(shape, true_ms(shape, slower))
    probe = StepShape.of([(800, 1)] * 16).plus_prefill(2000, 300)
    assert model.predict_ms(probe) == pytest.approx(true_ms(probe, slower), rel=0.05)


def test_coefficients_stay_non_negative_and_unseen_features_stay_zero() -> None:
    """Decode-only steps say nothing of prompt cost: the model must not invent one."""
    rng = random.Random(3)
    model = StepCostModel()
    for _ in range(50):
        shape = StepShape.of((rng.randrange(10, 400), 1) for _ in range(rng.randrange(1, 40)))
        model.observe(shape, true_ms(shape) * rng.uniform(0.9, 1.1))
    coef = model.coefficients
    assert (coef >= 0).all()
    assert coef[3] == 0.0
    assert coef[4] == 0.0
    assert model.largest_prefill == 0


def test_broken_readings_are_ignored() -> None:
    model = StepCostModel()
    model.observe(StepShape(decode_rows=1), float("nan"))
    model.observe(StepShape(decode_rows=1), -1.0)
    model.observe(StepShape(decode_rows=1), float("inf"))
    assert model.num_samples == 0
