"""Every standard object the chart renders, in every shape of its values, is valid against
Kubernetes' own OpenAPI schemas (``kubernetes-validate``, strict: unknown fields are
errors) for the oldest Kubernetes the chart claims and the newest the package knows."""

from __future__ import annotations

import copy
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from helpers.chart_values import SCENARIOS
from helpers.helm_chart import CHART, Obj, of_kind, render

OLDEST = "1.25.0"  # Chart.yaml's kubeVersion
VERSIONS = (OLDEST, kubernetes_validate.latest_version())
KEDA_API = "keda.sh/"


def test_versions_cover_what_the_chart_claims() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    assert chart["kubeVersion"] == f">={OLDEST}-0"
    assert OLDEST in kubernetes_validate.utils.all_versions()


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_standard_objects_match_the_kubernetes_schemas(scenario: str, tmp_path: Path) -> None:
    objects = render(SCENARIOS[scenario], tmp_path)
    standard = [o for o in objects if not o["apiVersion"].startswith(KEDA_API)]
    assert of_kind(standard, "Deployment"), "every shape has workers"
    for obj in standard:
        for version in VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


def test_keda_objects_are_beyond_kubernetes_validate(tmp_path: Path) -> None:
    """Why tests/deploy/test_chart_keda.py checks them against KEDA's CRDs instead."""
    keda = [o for o in render({}, tmp_path) if o["apiVersion"].startswith(KEDA_API)]
    assert {o["kind"] for o in keda} == {"ScaledObject", "TriggerAuthentication"}
    for obj in keda:
        with pytest.raises(kubernetes_validate.SchemaNotFoundError):
            kubernetes_validate.validate(obj, VERSIONS[-1], strict=True)


def _broken(objects: list[Obj]) -> Obj:
    deployment = copy.deepcopy(of_kind(objects, "Deployment")[0])
    probe = deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    probe["httpGet"]["pathh"] = probe["httpGet"].pop("path")  # a typo, as a person makes
    return deployment


def test_the_check_catches_an_unknown_field(tmp_path: Path) -> None:
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(_broken(render({}, tmp_path)), VERSIONS[-1], strict=True)
