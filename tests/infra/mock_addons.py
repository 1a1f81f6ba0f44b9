"""The mocks' EKS add-on configuration check: CreateAddon and UpdateAddon validate
configurationValues against the add-on version's JSON schema (`aws eks describe-addon-configuration`)
and refuse what it does not allow with InvalidParameterException.

The schema of eks-node-monitoring-agent is its chart's charts/configuration.schema.json
(aws/eks-node-monitoring-agent v1.7.0): every object has additionalProperties false. Here are the
properties it allows at the two levels the program writes, and the type of `tolerations` (an array
of objects); an add-on whose schema the mocks do not know takes no configuration here."""

from __future__ import annotations

import json

# Object path -> the properties the schema allows there.
_PROPERTIES = {
    "eks-node-monitoring-agent": {
        (): {"global", "nodeAgent", "dcgmAgent", "extraObjects"},
        ("nodeAgent",): {"affinity", "additionalArgs", "podAnnotations", "podLabels",
                         "nodeSelector", "priorityClassName", "probePort", "resources",
                         "resizePolicy", "tolerations", "monitors"},
        ("dcgmAgent",): {"affinity", "podAnnotations", "podLabels", "nodeSelector",
                         "priorityClassName", "resources", "resizePolicy", "tolerations"},
    },
}


def _refused(addon: str, error: str) -> ValueError:
    return ValueError(f"creating EKS Add-On ({addon}): InvalidParameterException: "
                      f"ConfigurationValue provided in request is not supported: Json schema "
                      f"validation failed with error: [{error}]")


def check_configuration(addon: str, text: str | None) -> None:
    """Raise as EKS answers a configurationValues its schema refuses."""
    if not text:
        return
    if addon not in _PROPERTIES:
        raise ValueError(f"mock EKS: no configuration schema known for add-on {addon}")
    values = json.loads(text)
    for path, allowed in _PROPERTIES[addon].items():
        node = values
        for part in path:
            node = node.get(part, {}) if isinstance(node, dict) else {}
        if not isinstance(node, dict):
            raise _refused(addon, f"$.{'.'.join(path)}: object expected")
        for key in sorted(set(node) - allowed):
            raise _refused(addon, f"$.{'.'.join((*path, key))}: is not defined in the schema and "
                                  "the schema does not allow additional properties")
        tolerations = node.get("tolerations", []) if path else []
        if not (isinstance(tolerations, list) and all(isinstance(t, dict) for t in tolerations)):
            raise _refused(addon, f"$.{'.'.join((*path, 'tolerations'))}: array of objects "
                                  "expected")
