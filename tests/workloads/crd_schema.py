"""Strict validation of custom resources against a CRD's openAPIV3Schema, as the API server's
strict field validation does: wrong types, missing required fields, values outside an enum, and
any property the schema does not name (unless x-kubernetes-preserve-unknown-fields) are errors."""

from __future__ import annotations

from pathlib import Path

import yaml

OBJECT_META_FIELDS = {"name", "namespace", "labels", "annotations", "generateName",
                      "finalizers", "ownerReferences"}
_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}


def load_schema(crd_path: Path, version: str = "v1") -> dict:
    crd = yaml.load(crd_path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"]["openAPIV3Schema"]


def validate(obj, schema: dict) -> list[str]:
    errors: list[str] = []
    _check(obj, schema, "", errors)
    if isinstance(obj, dict):
        for key in obj.get("metadata", {}):
            if key not in OBJECT_META_FIELDS:
                errors.append(f".metadata.{key}: unknown field")
    return errors


def _type_ok(value, schema: dict) -> bool:
    if schema.get("x-kubernetes-int-or-string"):
        return isinstance(value, (int, str)) and not isinstance(value, bool)
    t = schema.get("type")
    if t is None:
        return True
    if t == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if t == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _TYPES[t])


def _check(value, schema: dict, path: str, errors: list[str]) -> None:
    if not _type_ok(value, schema):
        errors.append(f"{path or '.'}: expected {schema.get('type')}, got {type(value).__name__} "
                      f"({value!r:.60})")
        return
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in {schema['enum']}")
    if "minimum" in schema and isinstance(value, (int, float)) and value < schema["minimum"]:
        errors.append(f"{path}: {value!r} is below the minimum {schema['minimum']}")
    if isinstance(value, dict):
        props = schema.get("properties")
        for req in schema.get("required", []):
            if req not in value:
                errors.append(f"{path}.{req}: required field missing")
        for key, item in value.items():
            if props is not None and key in props:
                _check(item, props[key], f"{path}.{key}", errors)
            elif isinstance(schema.get("additionalProperties"), dict):
                _check(item, schema["additionalProperties"], f"{path}.{key}", errors)
            elif schema.get("x-kubernetes-preserve-unknown-fields") or path == "" and key in (
                    "apiVersion", "kind", "metadata"):
                continue
            elif props is not None or schema.get("additionalProperties") is False:
                errors.append(f"{path}.{key}: unknown field")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            _check(item, schema["items"], f"{path}[{i}]", errors)


def rayjob_rules(job: dict) -> list[str]:
    """The rules of KubeRay v1.7.0's ValidateRayJobSpec and validateDeletionConfiguration
    (ray-operator/controllers/ray/utils/validation.go) that bear on the fields we set: what the
    operator rejects at reconcile time beyond the schema (the RayJob is then marked Failed
    without ever running). Not covered: ValidateRayClusterSpec and ValidateRayJobMetadata."""
    spec, errors = job["spec"], []
    selector = bool(spec.get("clusterSelector"))
    shutdown = spec.get("shutdownAfterJobFinishes", False)
    if not selector and "rayClusterSpec" not in spec:
        errors.append("one of rayClusterSpec or clusterSelector must be set")
    if selector and spec.get("backoffLimit", 0) > 0:
        errors.append("backoffLimit is incompatible with clusterSelector")
    if spec.get("ttlSecondsAfterFinished", 0) > 0 and not shutdown:
        errors.append("ttlSecondsAfterFinished needs shutdownAfterJobFinishes")
    if shutdown and spec.get("deletionStrategy", {}).get("deletionRules"):
        errors.append("shutdownAfterJobFinishes and deletionStrategy.deletionRules are exclusive")
    if spec.get("suspend") and not shutdown:
        errors.append("suspend needs shutdownAfterJobFinishes")
    for key in ("activeDeadlineSeconds", "preRunningDeadlineSeconds"):
        if key in spec and spec[key] <= 0:
            errors.append(f"{key} must be a positive integer")
    return errors
