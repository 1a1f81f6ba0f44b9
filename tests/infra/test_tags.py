"""Everything billed carries the stack's tags: each AWS resource whose type takes tags, pulumi-eks's
cluster (which passes them to its own resources), and what the launch templates launch."""

from __future__ import annotations

import importlib
import inspect

import pytest

from tests.infra.harness import run_program
from tests.infra.test_program import DEV, LT
from tests.stack.stacks import raw_config

TAGS = {"environment": "dev", "project": "eks-ray-train"}  # Pulumi.dev.yaml


def tag_argument(typ: str) -> str | None:
    """The argument through which a pulumi_aws resource type takes tags, from its SDK signature."""
    _, module, cls = typ.split(":")
    resource = getattr(importlib.import_module(f"pulumi_aws.{module.split('/')[0]}"), cls)
    params = inspect.signature(resource._internal_init).parameters
    return next((p for p in ("tags", "resource_tags") if p in params), None)


@pytest.fixture(scope="module")
def dev():
    return run_program(DEV, {"adminPrincipalArn": "arn:aws:iam::123456789012:role/team"})


def test_the_dev_stack_has_the_tags_checked_here():
    assert raw_config(DEV)[0]["tags"] == '{"environment": "dev", "project": "eks-ray-train"}'


def test_every_resource_that_takes_tags_carries_the_stacks(dev):
    taggable = {}
    for r in dev.resources:
        if r.type.startswith("aws:") and (arg := tag_argument(r.type)):
            taggable[r.name] = r.inputs.get("tags" if arg == "tags" else "resourceTags") or {}
    assert {"eks-coredns", "ckpt-ray-pods-identity", "autoscaler-identity", "eks-gpu-lt",
            "images-repositories", "images-repository-creation", "eks-gpu-node"} <= set(taggable)
    assert {name for name, tags in taggable.items() if not TAGS.items() <= tags.items()} == set()
    cluster = dev.one("eks:index:Cluster").inputs
    assert TAGS.items() <= cluster["tags"].items()
    assert TAGS.items() <= cluster["accessEntries"]["admin"]["tags"].items()


@pytest.mark.parametrize("template", ["gpu-lt", "system-lt"])
def test_launch_templates_tag_instances_volumes_and_network_interfaces(dev, template):
    specs = dev.one(LT, template).inputs["tagSpecifications"]
    assert {s["resourceType"] for s in specs} == {"instance", "volume", "network-interface"}
    assert all(s["tags"] == TAGS for s in specs)


def test_a_stack_without_tags_sends_no_empty_tag_specification():
    m = run_program(DEV, {"tags": "{}"})
    assert all("tagSpecifications" not in r.inputs for r in m.of_type(LT))
    assert not m.of_type("aws:iam/role:Role", "repository-creation")  # no tags: no role for them
