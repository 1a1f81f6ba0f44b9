"""`python -m stack.regions` against moto's EC2 (it answers DescribeRegions and, per zone,
DescribeInstanceTypeOfferings from its own offering data) and a botocore Stubber for Service
Quotas: moto 5.2.5's servicequotas mock does not know the EC2 vCPU codes (GetServiceQuota for
L-DB2E81BA raises NoSuchResourceException), so its responses are shaped as the Service Quotas API
reference documents GetServiceQuota / GetAWSDefaultServiceQuota: {"Quota": {ServiceCode,
QuotaCode, QuotaName, Value, ...}}, and NoSuchResourceException for a quota with no applied
value."""

from __future__ import annotations

import shutil
import subprocess
import sys

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from stack import catalog, regions
from tests.conftest import REPO

G6 = "g6.12xlarge"  # Pulumi.yaml's default gpuInstanceType, the dev stack's


def quota_response(code: str, value: float, region: str) -> dict:
    return {"Quota": {"ServiceCode": "ec2",
                      "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
                      "QuotaArn": f"arn:aws:servicequotas:{region}::ec2/{code}", "QuotaCode": code,
                      "QuotaName": "a vCPU quota", "Value": value, "Unit": "None",
                      "Adjustable": True, "GlobalQuota": False}}


class Fake:
    """moto's EC2 and, per Region, a stubbed Service Quotas client answering `applied`
    (region -> code -> vCPUs); a code with no applied value answers NoSuchResourceException,
    then its `default`. Every stub asserts the exact ServiceCode/QuotaCode it was asked for."""

    def __init__(self, applied: dict[str, dict[str, float]], default: float = 0.0,
                 codes: tuple[str, ...] = ("L-DB2E81BA", "L-3819A6DF")):
        self.applied, self.default, self.codes = applied, default, codes
        self.stubs: dict[str, Stubber] = {}

    def __call__(self, service: str, region: str):
        if service == "ec2":
            return boto3.client("ec2", region_name=region)
        client = boto3.client("service-quotas", region_name=region)
        stub = Stubber(client)
        for code in self.codes:
            params = {"ServiceCode": "ec2", "QuotaCode": code}
            value = self.applied.get(region, {}).get(code)
            if value is None:
                stub.add_client_error("get_service_quota", "NoSuchResourceException",
                                      expected_params=params)
                stub.add_response("get_aws_default_service_quota",
                                  quota_response(code, self.default, region), params)
            else:
                stub.add_response("get_service_quota", quota_response(code, value, region), params)
        stub.activate()
        self.stubs[region] = stub
        return client

    def all_answered(self) -> None:
        for stub in self.stubs.values():
            stub.assert_no_pending_responses()


@pytest.fixture(autouse=True)
def aws(monkeypatch):
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        yield


def test_the_dev_stack_lists_offering_regions_quotas_price_and_keys(capsys):
    fake = Fake({"us-west-2": {"L-DB2E81BA": 192, "L-3819A6DF": 48}})
    argv = ["--stack", "dev", "--regions", "us-east-1,us-west-2,af-south-1"]
    rc = regions.main(argv, client=fake)
    out = capsys.readouterr().out.splitlines()
    fake.all_answered()
    assert rc == 0
    # dev: 2 x g6.12xlarge (48 vCPUs) on demand; moto offers g6.12xlarge in no af-south-1 zone
    assert out[0].startswith(f"{G6} (48 vCPUs): 2 on-demand node(s) need 96 vCPUs; offered in 2")
    west = out.index(next(line for line in out if line.startswith("us-west-2 (current)")))
    assert west == 1, "the Region whose quota holds the nodes comes first"
    assert "on-demand quota 192 vCPUs enough; spot quota 48 vCPUs;" in out[west]
    assert "4.6016 USD/h on-demand" in out[west]  # catalog's us-west-2 price
    assert out[west + 1:west + 3] == ["  pulumi config set aws:region us-west-2 --stack dev",
                                      f"  pulumi config set gpuInstanceType {G6} --stack dev"]
    east = next(line for line in out if line.startswith("us-east-1:"))
    assert "on-demand quota 0 vCPUs < 96 needed" in east  # the default, no applied value
    assert "zones us-east-1a" in east
    assert not any(line.startswith("af-south-1") for line in out)


def test_every_enabled_region_is_read_from_describe_regions():
    fake = Fake({}, default=64)
    found = regions.offers(fake, regions.target(G6, 1, "on-demand"))
    names = [o.region for o in found]
    assert "us-east-1" in names and "us-west-2" in names and names == sorted(names)
    assert all(o.zones and all(z.startswith(o.region) for z in o.zones) for o in found)
    assert all(o.on_demand == 64 and o.spot == 64 for o in found)
    # the price only where the catalog read one, no estimate for other Regions
    assert {o.region for o in found if o.price is not None} <= set(catalog.PRICES_USD_PER_HOUR)
    fake.all_answered()


def test_a_p_type_reads_the_p_quota_codes_and_spot_marks_the_spot_quota():
    fake = Fake({"us-east-1": {"L-417A185B": 0, "L-7212CCBC": 384}},
                codes=("L-417A185B", "L-7212CCBC"))
    want = regions.target("p5.48xlarge", 2, "spot")
    lines = regions.report(want, regions.offers(fake, want, ["us-east-1"]))
    fake.all_answered()
    assert "on-demand quota 0 vCPUs; spot quota 384 vCPUs enough;" in lines[1]


def test_a_pinned_zone_not_offered_in_a_region_is_reset(tmp_path):
    shutil.copy(REPO / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    (tmp_path / "Pulumi.x.yaml").write_text(
        "config:\n  aws:region: us-west-2\n  eks-ray-train:gpuAvailabilityZone: us-west-2b\n"
        "  eks-ray-train:gpuNodeCount: 1\n")
    want = regions.target_from_stack("x", tmp_path)
    assert (want.region, want.zone, want.nodes, want.instance_type) == \
        ("us-west-2", "us-west-2b", 1, G6)
    east = regions.RegionOffer("us-east-1", ("us-east-1a", "us-east-1c"), 0, 0, None)
    assert regions.keys(want, east)[-1] == \
        "pulumi config set gpuAvailabilityZone us-east-1a --stack x"
    west = regions.RegionOffer("us-west-2", ("us-west-2a", "us-west-2b"), 0, 0, None)
    assert not any("gpuAvailabilityZone" in k for k in regions.keys(want, west))


def test_access_denied_is_one_line_and_exit_2(capsys):
    ec2 = boto3.client("ec2", region_name="us-east-1")
    stub = Stubber(ec2)
    stub.add_client_error("describe_regions", "UnauthorizedOperation",
                          "You are not authorized to perform this operation.")
    stub.activate()
    rc = regions.main(["--instance-type", G6], client=lambda service, region: ec2)
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("error: access denied:")


def test_no_credentials_is_one_line_and_exit_2(capsys, monkeypatch, tmp_path):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # the real boto3 client, with nowhere to find credentials
    rc = regions.main(["--instance-type", G6, "--regions", "us-east-1"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("error: no AWS credentials")


@pytest.mark.parametrize("argv, says", [
    (["--instance-type", "g6.12xlarg"],
     "gpuInstanceType: unknown 'g6.12xlarg'; did you mean g6.12xlarge?"),
    (["--stack", "nope"], "no stack file Pulumi.nope.yaml (have Pulumi.dev.yaml"),
    ([], "give --stack NAME or --instance-type TYPE"),
])
def test_bad_input_is_one_line_and_exit_2(argv, says, capsys):
    assert regions.main(argv, client=Fake({})) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err


def test_importing_it_loads_neither_boto3_nor_pulumi():
    code = "import sys, stack.regions; print(' '.join(sys.modules))"
    loaded = set(subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                                text=True, check=True).stdout.split())
    assert "stack.regions" in loaded
    assert not {m for m in loaded if m.split(".")[0] in {"boto3", "botocore", "pulumi"}}
