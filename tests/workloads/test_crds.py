"""KubeRay's CRDs: fetched by the program from the pinned release (here from a loopback server
holding ../shared's copies), only the kinds the operator serves, and a failed fetch stops the
program before any resource with the URL and the HTTP status."""

from __future__ import annotations

import pytest
import yaml

from stack.catalog import KUBERAY_CRD_KINDS
from tests.conftest import KUBERAY_CRDS, need
from tests.infra import release_server
from tests.infra.harness import run_program
from tests.infra.mocks import RecordingMocks
from tests.stack.stacks import STACK_FILES, stack_name
from workloads.crds import CrdFetchError

DEV = next(p for p in STACK_FILES if stack_name(p) == "dev")
GROUP = "kubernetes:yaml/v2:ConfigGroup"


@pytest.fixture(scope="module")
def applied() -> dict[str, str]:
    """CRD kind -> the YAML the program hands the provider."""
    m = run_program(DEV)
    texts = [r.inputs["yaml"] for r in m.of_type(GROUP, "addons-crd-")]
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return {yaml.load(t, Loader=loader)["spec"]["names"]["kind"]: t for t in texts}


def test_only_the_kinds_the_operator_serves_are_applied(applied):
    # KubeRay 1.7.0 starts the RayCluster, RayJob and RayService controllers; RayCronJob's sits
    # behind an alpha feature gate that is off.
    assert sorted(applied) == sorted(KUBERAY_CRD_KINDS) == ["RayCluster", "RayJob", "RayService"]


@pytest.mark.parametrize("kind", ["RayCluster", "RayJob"])
def test_the_applied_crd_is_the_release_file(applied, kind):
    assert applied[kind] == need(KUBERAY_CRDS / f"ray.io_{kind.lower()}s.yaml").read_text()


@pytest.mark.parametrize("status, says", [
    ("404", "answered HTTP 404 Not Found"),
    ("429", "answered HTTP 429 Too Many Requests (try again later)"),
    ("200", "is not its CRD: not a YAML object: '<html>not a CRD</html>'"),
])
def test_a_release_file_that_cannot_be_had_stops_the_program_before_any_resource(status, says):
    """yaml/v2 with a URL turned these into a YAML decode error on every preview."""
    template = release_server.crd_url(f"/status/{status}")
    mocks = RecordingMocks("us-west-2")
    with pytest.raises(CrdFetchError) as error:
        run_program(DEV, mocks=mocks, crd_url=template)
    url = template.format(version="1.7.0", plural="rayclusters")
    assert str(error.value).startswith("KubeRay CRD RayCluster: ") and url in str(error.value)
    assert says in str(error.value)
    assert mocks.resources == []
