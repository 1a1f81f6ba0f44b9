"""The stack key gpuCapacityType: on-demand (the default) or spot, anything else refused; its one
record (with capacityBlock's) read by the node group, the quota check and the scale-up watch."""

from __future__ import annotations

import dataclasses

import pytest

from infra.node_groups import node_groups
from infra.quota import quota_needs
from stack import catalog
from stack.config import ConfigError, StackConfig
from stack.parse import parse
from training.head.scaleup import CAPACITY_TYPE_ENV, QUOTA_ENV, Market
from workloads.scaleup_watch import watch_container


def test_on_demand_is_the_default_and_spot_is_taken():
    assert parse({}, "us-west-2").gpu_capacity is catalog.ON_DEMAND
    assert parse({"gpuCapacityType": "spot"}, "us-west-2").spot


def test_a_typo_is_refused_with_the_known_values():
    with pytest.raises(ConfigError) as e:
        parse({"gpuCapacityType": "spto"}, "us-west-2")
    assert ("gpuCapacityType: unknown 'spto'; did you mean spot?; use one of on-demand, spot"
            in str(e.value))


@pytest.mark.parametrize("key", ["capacityReservation", "capacityBlock"])
def test_spot_cannot_launch_into_a_reservation(key):
    with pytest.raises(ConfigError, match=f"gpuCapacityType: spot nodes cannot launch into the "
                                          f"{key}"):
        parse({"gpuCapacityType": "spot", key: '{"id": "cr-0123456789abcdef0", '
               '"instanceCount": 2}', "gpuAvailabilityZone": "us-west-2b",
               "gpuInstanceType": "p5.48xlarge"}, "us-west-2")


def test_a_typo_is_reported_with_the_other_problems_and_capacity_block_is_not_a_value():
    with pytest.raises(ConfigError) as e:
        parse({"gpuCapacityType": "capacity-block", "vpcCidr": "10.0.0.0/8"}, "us-west-2")
    assert "gpuCapacityType: unknown 'capacity-block'" in str(e.value)
    assert "vpcCidr: '10.0.0.0/8'" in str(e.value)  # one attempt lists both


# Each capacity record, and the stack keys that select it.
BLOCK = {"capacityBlock": '{"id": "cr-0123456789abcdef0", "instanceCount": 2}',
         "gpuInstanceType": "p5.48xlarge", "gpuAvailabilityZone": "us-west-2b"}
SELECTED_BY = {catalog.ON_DEMAND: {}, catalog.SPOT: {"gpuCapacityType": "spot"},
               catalog.CAPACITY_BLOCK: BLOCK}


def readers(cfg: StackConfig) -> tuple[str | None, set[str], dict[str, str]]:
    """What each reader of the capacity makes of the stack: the GPU node group's capacityType,
    the quota codes the quota check reads for its nodes, the scale-up watch's environment."""
    (gpu,) = [g for g in node_groups(cfg) if g.key == "gpu"]
    codes = {n.quota.code for n in quota_needs(cfg) if n.what.startswith(gpu.count_key)}
    env = {e["name"]: e["value"] for e in watch_container(cfg, "job")["env"] if "value" in e}
    return gpu.capacity_type, codes, env


@pytest.mark.parametrize("capacity", SELECTED_BY, ids=lambda c: c.name)
def test_the_node_group_the_quota_check_and_the_watch_read_the_stack_s_one_record(capacity):
    cfg = parse(SELECTED_BY[capacity], "us-west-2")
    assert cfg.gpu_capacity is capacity
    eks_name, codes, env = readers(cfg)
    assert eks_name == capacity.eks_name
    quota = capacity.vcpu_quota(cfg.gpu_instance_type)
    assert codes == ({quota.code} if quota else set())
    assert env[CAPACITY_TYPE_ENV] == capacity.name
    assert env.get(QUOTA_ENV) == (f"{quota.name}, {quota.code}" if quota else None)
    # The head reads the stack's spelling: spot's fix only for spot nodes.
    assert ("spot capacity" in Market.from_env(env).capacity_fix()) == (capacity is catalog.SPOT)


def test_a_capacity_record_reaches_every_reader_as_it_is():
    """No reader keeps a table or a spelling of its own: a record the catalog does not have
    comes out of all of them, down to the quota code the head's fix names."""
    made_up = catalog.GpuCapacity("test-market", "TEST_MARKET",
                                  {"g": catalog.ServiceQuota("L-00000000", "Test G vCPUs")})
    eks_name, codes, env = readers(dataclasses.replace(parse({}, "us-west-2"),
                                                       gpu_capacity=made_up))
    assert (eks_name, codes) == ("TEST_MARKET", {"L-00000000"})
    assert env[CAPACITY_TYPE_ENV] == "test-market"
    assert "'Test G vCPUs, L-00000000'" in Market.from_env(env).quota_fix()


def test_the_head_names_no_quota_the_environment_does_not_carry():
    assert "L-" not in Market.from_env({}).quota_fix()
